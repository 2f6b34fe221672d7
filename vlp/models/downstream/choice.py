"""VCR multiple choice: Linear(H, 1) on the pooled [CLS] of each (question, choice) row, CE
over the 4 rows of a group."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from vlp.datasets.downstream import keys as D

from .base import Batch, DownstreamHead, accuracy, encode, group_view


class ChoiceScorer(DownstreamHead):
    def __init__(self, name: str, hidden: int):
        super().__init__()
        self.name = name
        self.out = nn.Linear(hidden, 1)

    def predict(self, backbone, batch: Batch) -> torch.Tensor:
        return group_view(self.out(encode(backbone, batch).pooled_output).squeeze(-1), batch)

    def losses(self, backbone, batch: Batch) -> dict[str, torch.Tensor]:
        scores = self.predict(backbone, batch).float()
        labels = batch[D.LABELS].long()
        return {f"{self.name}_loss": F.cross_entropy(scores, labels),
                f"{self.name}_acc": accuracy(scores, labels)}
