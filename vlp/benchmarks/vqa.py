"""VQA (UNITER §4.1): answer vocabulary from the training answers, soft scores from the 10
annotators, Linear(H,2H)→GELU→LN→Linear(2H,#answers) on [CLS], BCE summed over answers;
scored with the official evaluator's accuracy (leave-one-out over the 10 annotators)."""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import pyarrow.parquet as pq
from pydantic import Field

from vlp.datasets.downstream.vqa import AnswerVocab, VqaData
from vlp.datasets.storage.world import load_manifest
from vlp.models.heads import build_head
from vlp.contract.config_loader import ConfigModel
from vlp.benchmarks.metrics import normalize_vqa_answer, vqa_score, vqa_target_score
from vlp.benchmarks.base import (Benchmark, BenchmarkContext, EvalResult,
                                                   TrainDefaults, hidden_size, layer_norm_eps,
                                                   register)


class VqaOptions(ConfigModel):
    max_answers: int = Field(3129, gt=0)   # VQA v2: the 3129 most frequent answers
    min_count: int = Field(1, gt=0)        # questions whose majority answer it is (BUTD: 9)


@lru_cache(maxsize=4)
def answer_vocab(world: str, max_answers: int, min_count: int) -> AnswerVocab:
    table = pq.read_table(load_manifest(world).task_file("vqa", "train"), columns=["answers"])
    return AnswerVocab.build(table.column("answers").to_pylist(), normalize_vqa_answer,
                             vqa_target_score, max_answers, min_count)


@register
class Vqa(Benchmark):
    name = "vqa"
    table = "vqa"
    description = "VQA v2: answer a question about an image (VQA score)"
    defaults = TrainDefaults(steps=600, batch_size=32, lr=2e-4)
    Options = VqaOptions
    meta_parts = {"vqa": "vqa_score"}
    primary = "vqa_score"

    def vocab(self, ctx: BenchmarkContext) -> AnswerVocab:
        o = ctx.options
        return answer_vocab(ctx.data.world, o.max_answers, o.min_count)

    def train_data(self, ctx):
        return VqaData(ctx.data, "train", self.vocab(ctx))

    def eval_data(self, ctx):
        return VqaData(ctx.data, ctx.eval_split, self.vocab(ctx))

    def build_head(self, ctx, backbone, itm_head):
        return build_head("soft-score-classifier", name=self.task, hidden=hidden_size(ctx),
                          num_answers=len(self.vocab(ctx)), eps=layer_norm_eps(ctx))

    def evaluate(self, ctx: BenchmarkContext, data: VqaData, runner) -> EvalResult | None:
        logits = runner.predict_sharded(data.batch, len(data))
        if logits is None:
            return None
        answers = [data.vocab.answers[i] for i in logits.argmax(1)]
        qids = data.column("question_id")
        score = vqa_score(answers, data.answers)
        return EvalResult({"vqa_score": score, "answer_coverage": 100 * data.coverage},
                          [{"question_id": q, "answer": a} for q, a in zip(qids, answers)])
