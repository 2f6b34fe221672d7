"""RE comprehension: Linear(H, 1) on every region's output; padding masked; CE over regions."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from vlp.contract import downstream_keys as D

from vlp.models.heads.head import Batch, DownstreamHead, accuracy

NEG = -1e4   # a masked region's score: exp() underflows, no NaN in bf16/fp16 (unlike -inf)


class RegionScorer(DownstreamHead):
    def __init__(self, name: str, hidden: int):
        super().__init__()
        self.name = name
        self.out = nn.Linear(hidden, 1)

    def predict(self, backbone, batch: Batch) -> torch.Tensor:
        enc = backbone(batch, pool=False)
        scores = self.out(enc.region_output()).squeeze(-1).float()   # [B, N]
        return scores.masked_fill(~enc.region_mask, NEG)

    def losses(self, backbone, batch: Batch) -> dict[str, torch.Tensor]:
        scores = self.predict(backbone, batch)
        labels = batch[D.LABELS].long()
        return {f"{self.name}_loss": F.cross_entropy(scores, labels),
                f"{self.name}_acc": accuracy(scores, labels)}
