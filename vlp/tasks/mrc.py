"""MRC: classify a masked region as the detector's top class (UNITER).

Masking (UNITER's masked region modeling, shared by MRFR and MRC-kl): 15% of the regions of
each positive pair (at least one per image) get zero input features; ``region_masked`` marks
where the loss is computed (here the same rows as ``region_zeroed``).

Head (UNITER's ``region_classifier``, shared with MRC-kl): Linear → GELU → LN → Linear(H, C).
Label: argmax of the detector's distribution over classes 1..C-1 (background, class 0,
excluded) — from ``region_class_labels``, or derived from ``region_soft_labels`` when the batch
carries only those. Loss: CE over masked regions of true pairs, mean.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from vlp.contract import batch_spec as bs
from vlp.contract.batch_access import BatchError
from vlp.contract.encoder_output import EncoderOutput
from vlp.tasks.losses import accuracy, region_targets, target_valid, weighted_mean, zero_loss
from vlp.tasks.masking_visual import choose_regions, mask_with_hard_labels
from vlp.tasks.registry import register
from vlp.tasks.spec import ArrayBatch, Batch, HeadContext, MaskContext, Task


class RegionClassifier(nn.Module):
    def __init__(self, ctx: HeadContext):
        super().__init__()
        h = ctx.hidden_size
        self.net = nn.Sequential(nn.Linear(h, h), nn.GELU(),
                                 nn.LayerNorm(h, eps=ctx.layer_norm_eps),
                                 nn.Linear(h, ctx.num_classes))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.net(hidden)


def hard_region_labels(batch: Batch, who: str) -> torch.Tensor:
    """long [B, N]: the detector's class per region, background excluded."""
    labels = batch.get(bs.REGION_CLASS_LABELS)
    if labels is not None:
        return labels.long()
    soft = batch.get(bs.REGION_SOFT_LABELS)
    if soft is None:
        raise BatchError(f"{who} needs batch key {bs.REGION_CLASS_LABELS!r} "
                         f"(or {bs.REGION_SOFT_LABELS!r} to derive it from)")
    return soft[..., 1:].argmax(-1) + 1


def classification_terms(task: str, head: nn.Module, enc: EncoderOutput,
                         batch: Batch) -> dict[str, torch.Tensor]:
    labels = hard_region_labels(batch, task)
    targets = region_targets(enc, batch, task, labels)   # [2, M], its size known on the host
    if targets.shape[1] == 0:
        return {f"{task}_loss": zero_loss(enc), f"{task}_acc": zero_loss(enc).detach()}
    logits = head(enc.regions_at(targets))
    target = labels[targets[0], targets[1]]
    valid = target_valid(batch, bs.REGION_TARGETS)
    ce = F.cross_entropy(logits.float(), target, reduction="none")
    return {f"{task}_loss": weighted_mean(ce, valid),
            f"{task}_acc": accuracy(logits, target, valid)}


@register
class MaskedRegionClassification(Task):
    name, label, order = "mrc", "MRC", 2
    head_name = "region_classifier"
    modality = "regions"
    visual = frozenset({"regions"})
    families = frozenset({"uniter"})
    needs_soft_labels = True

    def mask(self, batch: ArrayBatch, rng: np.random.Generator, ctx: MaskContext) -> None:
        masked = choose_regions(batch, rng, ctx)
        mask_with_hard_labels(batch, masked, masked)

    def build_head(self, ctx: HeadContext) -> nn.Module:
        return RegionClassifier(ctx)

    def compute(self, head: nn.Module, enc: EncoderOutput, batch: Batch) -> dict[str, torch.Tensor]:
        return classification_terms(self.name, head, enc, batch)
