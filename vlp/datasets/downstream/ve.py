"""SNLI-VE: image premise + text hypothesis → entailment / neutral / contradiction."""

from __future__ import annotations

import numpy as np
import torch

from vlp.contract import downstream_keys as D
from vlp.datasets.downstream.base import TableData
from vlp.datasets.downstream.text import text_batch
from vlp.datasets.storage.task_tables import VE_LABELS


class VeData(TableData):
    task = "ve"
    classes = VE_LABELS

    def __init__(self, cfg, split: str):
        super().__init__(cfg, split)
        self.hypotheses = self.texts("hypothesis")
        self.rows = self.image_rows("image_id")
        self.labels = np.array([VE_LABELS.index(x) for x in self.column("label")], np.int64)

    def batch(self, idx: np.ndarray, rng: np.random.Generator | None = None
              ) -> dict[str, torch.Tensor]:
        idx = np.asarray(idx, np.int64)
        text = text_batch(self.tok, [(self.hypotheses, idx, 0)])
        visual = self.images.visual_arrays(self.rows[idx])
        return self.assemble(text, visual, len(idx), {D.LABELS: self.labels[idx],
                                                      D.EXAMPLE_INDEX: idx})
