"""VQA (UNITER §4.1): answer vocabulary from the training answers, soft scores from the 10
annotators, Linear(H,2H)→GELU→LN→Linear(2H,#answers) on [CLS] (VL-BERT: on an appended
[MASK], §4.2.2; ``answer_token``), BCE summed over answers;
scored with the official evaluator's accuracy (leave-one-out over the 10 annotators)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache
from typing import Literal

import numpy as np
import pyarrow.parquet as pq
from pydantic import Field

from vlp.datasets.downstream.vqa import AnswerVocab, VqaData
from vlp.contract.uri_files import open_input
from vlp.datasets.storage.world import load_manifest
from vlp.models.heads import build_head
from vlp.contract.config_loader import ConfigModel
from vlp.benchmarks.base import (Benchmark, BenchmarkContext, EvalResult, TrainDefaults,
                                 hidden_size, layer_norm_eps)
from vlp.benchmarks.accuracy import mean_over_best, tied_maxima
from vlp.benchmarks.registry import register


class VqaOptions(ConfigModel):
    max_answers: int = Field(3129, gt=0)   # VQA v2: the 3129 most frequent answers
    min_count: int = Field(1, gt=0)        # questions whose majority answer it is (BUTD: 9)
    # where the answer is read: cls = the pooled [CLS] (UNITER §4.1); mask = a [MASK] appended
    # as the answer segment (VL-BERT §4.2.2); "" = the family's paper's (VL-BERT: mask)
    answer_token: Literal["", "cls", "mask"] = ""


def answer_token(ctx: BenchmarkContext) -> str:
    return ctx.options.answer_token or ("mask" if ctx.family.visual.kind == "vlbert" else "cls")


def answer_type(ctx: BenchmarkContext) -> int:
    """The [MASK]'s segment: VL-BERT's sentence B (1); a family with one text type (UNITER:
    text 0, image 1) keeps it in the text's."""
    return 1 if ctx.family.visual.kind == "vlbert" else 0


@lru_cache(maxsize=4)
def answer_vocab(world: str, max_answers: int, min_count: int) -> AnswerVocab:
    table = pq.read_table(open_input(load_manifest(world).task_file("vqa", "train")),
                          columns=["answers"])
    return AnswerVocab.build(table.column("answers").to_pylist(), normalize_vqa_answer,
                             vqa_target_score, max_answers, min_count)


@register
class Vqa(Benchmark):
    name = "vqa"
    table = "vqa"
    description = "VQA v2: answer a question about an image (VQA score)"
    defaults = TrainDefaults(steps=600, batch_size=32, lr=2e-4)
    Options = VqaOptions
    primary = "vqa_score"

    def vocab(self, ctx: BenchmarkContext) -> AnswerVocab:
        o = ctx.options
        return answer_vocab(ctx.data.world, o.max_answers, o.min_count)

    def train_data(self, ctx):
        return VqaData(ctx.data, "train", self.vocab(ctx), answer_token(ctx), answer_type(ctx))

    def eval_data(self, ctx):
        return VqaData(ctx.data, ctx.eval_split, self.vocab(ctx), answer_token(ctx),
                       answer_type(ctx))

    def build_head(self, ctx, backbone, itm_head):
        return build_head("soft-score-classifier", name=self.task, hidden=hidden_size(ctx),
                          num_answers=len(self.vocab(ctx)), eps=layer_norm_eps(ctx),
                          from_token=answer_token(ctx) == "mask")

    def evaluate(self, ctx: BenchmarkContext, data: VqaData, runner) -> EvalResult | None:
        logits = runner.predict_sharded(data.batch, len(data))
        if logits is None:
            return None
        answers = [data.vocab.answers[i] for i in logits.argmax(1)]
        qids = data.column("question_id")
        score = expected_vqa_score(logits, data.vocab.answers, data.answers)
        return EvalResult({"vqa_score": score, "answer_coverage": 100 * data.coverage},
                          [{"question_id": q, "answer": a} for q, a in zip(qids, answers)])


# ---- the official VQA evaluator's metric (scores in percent, the unit of UNITER's Table 3)

_NUMBER_WORDS = {"none": "0", "zero": "0", "one": "1", "two": "2", "three": "3", "four": "4",
                 "five": "5", "six": "6", "seven": "7", "eight": "8", "nine": "9", "ten": "10"}
_ARTICLES = {"a", "an", "the"}
_PUNCT = re.compile(r"[;/\[\]\"{}()=+\\_\-><@`,?!*#%^&$~|:']")
_PERIOD = re.compile(r"(?<!\d)\.(?!\d)")  # a period that is not a decimal point


def normalize_vqa_answer(answer: str) -> str:
    """The official VQA evaluator's answer normalisation: lower case, punctuation removed
    (decimal points kept), number words to digits, articles dropped."""
    a = answer.lower().replace("\n", " ").replace("\t", " ").strip()
    a = _PERIOD.sub("", _PUNCT.sub("", a))
    words = [_NUMBER_WORDS.get(w, w) for w in a.split() if w not in _ARTICLES]
    return " ".join(words)


def vqa_accuracy(prediction: str, answers: Sequence[str]) -> float:
    """Official VQA accuracy of one prediction against the 10 annotator answers: for each
    annotator, min(1, #other annotators agreeing / 3), averaged over the 10 leave-one-out
    subsets (so 3 agreeing annotators give 0.9·1 + 0.1·(2/3)... = 1.0 only from 4 up)."""
    pred = normalize_vqa_answer(prediction)
    gts = [normalize_vqa_answer(a) for a in answers]
    if not gts:
        raise ValueError("vqa_accuracy: no annotator answers")
    matches = [g == pred for g in gts]
    total = sum(matches)
    accs = [min(1.0, (total - m) / 3.0) for m in matches]
    return float(np.mean(accs))


def vqa_target_score(count: int) -> float:
    """Soft training target for an answer given by ``count`` of the 10 annotators (the
    bottom-up-attention / UNITER preprocessing: 0, .3, .6, .9, 1)."""
    return (0.0, 0.3, 0.6, 0.9)[count] if count < 4 else 1.0


def vqa_score(predictions: Sequence[str], answers: Sequence[Sequence[str]]) -> float:
    """Mean official VQA accuracy over questions, in percent."""
    if len(predictions) != len(answers):
        raise ValueError(f"vqa_score: {len(predictions)} predictions for {len(answers)} questions")
    return 100.0 * float(np.mean([vqa_accuracy(p, a) for p, a in zip(predictions, answers)]))


def expected_vqa_score(logits: np.ndarray, vocab: Sequence[str],
                       answers: Sequence[Sequence[str]]) -> float:
    """Mean official VQA accuracy in percent of the argmax answer of ``logits`` [questions,
    vocab], ties broken at random (``vlp.benchmarks.accuracy``): a question's credit is the
    mean accuracy of its tied best answers. Only answers an annotator gave earn anything, so
    each question sums over its (at most 10) distinct annotator answers, not the vocabulary.
    A non-finite logit is never the answer; a question with none finite earns 0."""
    best = tied_maxima(logits)
    if len(best) != len(answers) or best.shape[1] != len(vocab):
        raise ValueError(f"expected_vqa_score: logits {best.shape} for {len(answers)} "
                         f"questions and {len(vocab)} answers")
    columns: dict[str, list[int]] = {}
    for i, a in enumerate(vocab):
        columns.setdefault(normalize_vqa_answer(a), []).append(i)
    credit = np.zeros(len(answers))
    for k, gts in enumerate(answers):
        for given in {normalize_vqa_answer(a) for a in gts}:
            tied = int(best[k, columns.get(given, [])].sum())
            if tied:
                credit[k] += tied * vqa_accuracy(given, gts)
    return 100.0 * float(mean_over_best(best, credit).mean())
