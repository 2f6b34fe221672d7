"""RE comprehension: Linear(H, 1) on every region's output, padding masked. Two losses:

- ``softmax`` (UNITER §4.1 / Appendix): cross-entropy over the regions of an expression;
- ``per-roi-binary`` (VL-BERT §4.2.3: "we compute the classification scores for all the input
  RoIs. For each RoI, a binary classification loss is applied"): a sigmoid cross-entropy per
  real region, 1 for the labelled region and 0 for every other, averaged over the batch's
  real regions.

Either way inference picks the region of highest score (VL-BERT: "we directly choose the RoI
with the highest classification score").
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from vlp.contract import downstream_keys as D

from vlp.models.heads.head import Batch, DownstreamHead, accuracy

NEG = -1e4   # a masked region's score: exp() underflows, no NaN in bf16/fp16 (unlike -inf)
REFEXP_LOSSES = ("softmax", "per-roi-binary")


def softmax_loss(scores: torch.Tensor, labels: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(scores, labels)


def per_roi_binary_loss(scores: torch.Tensor, labels: torch.Tensor,
                        real: torch.Tensor) -> torch.Tensor:
    """Mean over the real regions of BCE(sigmoid(score), region == label)."""
    # a comparison, not F.one_hot: no range check that could read the labels to the host
    target = (torch.arange(scores.shape[1], device=scores.device) == labels[:, None]).to(
        scores.dtype)
    each = F.binary_cross_entropy_with_logits(scores, target, reduction="none")
    weight = real.to(scores.dtype)
    return (each * weight).sum() / weight.sum().clamp(min=1)


class RegionScorer(DownstreamHead):
    def __init__(self, name: str, hidden: int, loss: str = "softmax"):
        super().__init__()
        if loss not in REFEXP_LOSSES:
            raise ValueError(f"unknown RefCOCO+ head loss {loss!r}; known: {REFEXP_LOSSES}")
        self.name, self.loss_name = name, loss
        self.out = nn.Linear(hidden, 1)

    def region_scores(self, backbone, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """([B, N] scores, masked regions at NEG; bool [B, N] real regions)."""
        enc = backbone(batch, pool=False)
        scores = self.out(enc.region_output()).squeeze(-1).float()
        return scores.masked_fill(~enc.region_mask, NEG), enc.region_mask

    def predict(self, backbone, batch: Batch) -> torch.Tensor:
        return self.region_scores(backbone, batch)[0]

    def losses(self, backbone, batch: Batch) -> dict[str, torch.Tensor]:
        scores, real = self.region_scores(backbone, batch)
        labels = batch[D.LABELS].long()
        loss = (per_roi_binary_loss if self.loss_name == "per-roi-binary" else softmax_loss)(
            scores, labels, real)
        return {f"{self.name}_loss": loss, f"{self.name}_acc": accuracy(scores, labels)}
