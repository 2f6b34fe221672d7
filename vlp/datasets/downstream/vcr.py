"""VCR: multiple choice in two stages, Q→A and QA→R (UNITER trains both in one model).

A Q→A group is 4 rows ``[CLS] question [SEP] answer_i [SEP]``; a QA→R group is 4 rows
``[CLS] question [SEP] right answer [SEP] rationale_i [SEP]``. Segments carry the token types
``types`` per stage (``{"q2a": (question, answer), "qa2r": (question, answer, rationale)}``;
UNITER extends its table to 4 rows: question 0, image 1, answer 2, rationale 3). Where QA→R's
question and answer share a type (VL-BERT: both sentence A, §4.2.1) they are one sentence,
``[CLS] question right answer [SEP] rationale_i [SEP]``. Holistic Q→AR is scored from the two
stages' predictions.
"""

from __future__ import annotations

import numpy as np
import torch

from vlp.contract import batch_spec as K
from vlp.contract import downstream_keys as D
from vlp.datasets.downstream.base import TableData
from vlp.datasets.downstream.data_errors import DownstreamDataError
from vlp.datasets.downstream.text import text_batch

STAGES = ("q2a", "qa2r")
CHOICES = 4


class VcrData(TableData):
    task = "vcr"

    def __init__(self, cfg, split: str,
                 types: dict[str, tuple[int, ...]] | None = None,
                 stages: tuple[str, ...] = STAGES):
        if not stages or any(s not in STAGES for s in stages):
            raise DownstreamDataError(f"VCR stages {stages!r}: expected a subset of {STAGES}")
        super().__init__(cfg, split)
        self.types = types or {"q2a": (0, 2), "qa2r": (0, 2, 3)}
        self.stages = tuple(stages)
        answers, rationales = self.column("answers"), self.column("rationales")
        bad = [k for k, (a, r) in enumerate(zip(answers, rationales))
               if len(a) != CHOICES or len(r) != CHOICES]
        if bad:
            raise DownstreamDataError(f"{self.path}: row {bad[0]} (and {len(bad) - 1} more) "
                                      f"does not have {CHOICES} answers and {CHOICES} rationales")
        self.questions = self.texts("question")
        self.answers = self.texts([a for row in answers for a in row])        # 4 per row
        self.rationales = self.texts([r for row in rationales for r in row])
        self.rows = self.image_rows("image_id")
        self.answer_labels = np.array(self.column("answer_label"), np.int64)
        self.rationale_labels = np.array(self.column("rationale_label"), np.int64)

    def stage_batch(self, idx: np.ndarray, stage: str) -> dict[str, np.ndarray]:
        idx = np.asarray(idx, np.int64)
        rows = np.repeat(idx, CHOICES)
        choice = np.tile(np.arange(CHOICES), len(idx))
        if stage == "q2a":
            q, a = self.types["q2a"]
            segments = [(self.questions, rows, q), (self.answers, rows * CHOICES + choice, a)]
            labels = self.answer_labels[idx]
        else:
            q, a, r = self.types["qa2r"]
            right = rows * CHOICES + self.answer_labels[rows]
            segments = [(self.questions, rows, q, q != a), (self.answers, right, a),
                        (self.rationales, rows * CHOICES + choice, r)]
            labels = self.rationale_labels[idx]
        return {"text": text_batch(self.tok, segments), "rows": rows, "labels": labels}

    def batch(self, idx: np.ndarray, rng: np.random.Generator | None = None,
              stages: tuple[str, ...] | None = None) -> dict[str, torch.Tensor]:
        """4-row groups: for each stage in ``stages`` (default: the configured ones), one
        group per question of ``idx``; ``labels`` holds the right choice of each group."""
        idx = np.asarray(idx, np.int64)
        parts = [self.stage_batch(idx, s) for s in (stages or self.stages)]
        text = _stack_text([p["text"] for p in parts])
        rows = np.concatenate([p["rows"] for p in parts])
        visual = self.images.visual_arrays(self.rows[rows])
        labels = np.concatenate([p["labels"] for p in parts])
        return self.assemble(text, visual, len(labels), {
            D.LABELS: labels, D.GROUP_SIZE: CHOICES,
            D.EXAMPLE_INDEX: np.tile(idx, len(parts))})


def _stack_text(parts: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    width = max(p[K.INPUT_IDS].shape[1] for p in parts)
    keys = set().union(*parts)
    out = {}
    for k in keys:
        arrs = [p.get(k, np.zeros_like(p[K.INPUT_IDS])) for p in parts]
        out[k] = np.concatenate([np.pad(a, [(0, 0), (0, width - a.shape[1])]) for a in arrs])
    return out
