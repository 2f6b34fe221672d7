"""VCR (UNITER §4.1 / Appendix A.2): Q→A and QA→R trained together; each (question, choice)
row classified right / wrong by its own two-class MLP on [CLS] (CE per row), a group's
choices ranked by P(right); token types extended to question / answer / rationale; Q→AR =
both stages right (the rationale scored given the right answer, VCR's protocol)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np

from vlp.datasets.downstream.vcr import VcrData
from vlp.contract.config_loader import ConfigModel
from vlp.models.heads import build_head, extend_for, layout_types
from vlp.benchmarks.base import Benchmark, EvalResult, TrainDefaults, hidden_size
from vlp.benchmarks.accuracy import expected_hits
from vlp.benchmarks.registry import register

STAGES = {"both": ("q2a", "qa2r"), "q2a": ("q2a",), "qa2r": ("qa2r",)}


class VcrOptions(ConfigModel):
    train_stages: Literal["both", "q2a", "qa2r"] = "both"


@register
class Vcr(Benchmark):
    name = "vcr"
    table = "vcr"
    description = "VCR: Q→A, QA→R and holistic Q→AR multiple choice (accuracy)"
    defaults = TrainDefaults(steps=500, batch_size=8, lr=1e-4)
    Options = VcrOptions
    primary = "q2ar"
    token_types = "vcr"

    def _data(self, ctx, split):
        types = layout_types(ctx.family, "vcr")[1]["vcr_types"]
        return VcrData(ctx.data, split, types, STAGES[ctx.options.train_stages])

    def train_data(self, ctx):
        return self._data(ctx, "train")

    def eval_data(self, ctx):
        return self._data(ctx, ctx.eval_split)

    def build_head(self, ctx, backbone, itm_head):
        extend_for(backbone, "vcr")
        return build_head("choice-pair-classifier", name=self.task, hidden=hidden_size(ctx))

    def evaluate(self, ctx, data: VcrData, runner) -> EvalResult | None:
        q2a = runner.predict_sharded(lambda idx: data.batch(idx, stages=("q2a",)), len(data),
                                     max(1, runner.batch_size // 4))
        qa2r = runner.predict_sharded(lambda idx: data.batch(idx, stages=("qa2r",)), len(data),
                                      max(1, runner.batch_size // 4))
        if q2a is None:
            return None
        a, r = q2a.argmax(1), qa2r.argmax(1)
        metrics = vcr_scores(q2a, data.answer_labels, qa2r, data.rationale_labels)
        return EvalResult(metrics, [{"id": i, "answer": int(x), "rationale": int(y)}
                                    for i, x, y in zip(data.column("id"), a, r)])


def vcr_scores(answer_scores: np.ndarray, answer_label: Sequence[int],
               rationale_scores: np.ndarray, rationale_label: Sequence[int]) -> dict[str, float]:
    """VCR from the choice scores [rows, 4] of each stage: Q→A, QA→R (the rationale given the
    right answer) and the holistic Q→AR (both right). Ties are broken at random, each stage
    on its own, so a row's Q→AR credit is the product of its two stages' expected hits
    (``vlp.benchmarks.accuracy``)."""
    qa = expected_hits(answer_scores, answer_label)
    qar_r = expected_hits(rationale_scores, rationale_label)
    return {"q2a": 100.0 * float(qa.mean()), "qa2r": 100.0 * float(qar_r.mean()),
            "q2ar": 100.0 * float((qa * qar_r).mean())}
