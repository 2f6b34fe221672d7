"""Masked RoI classification with linguistic clues (VL-BERT).

The masked RoI's visual feature embedding is replaced by a learned embedding (the embedder
does it for ``region_zeroed`` rows; the input row is zeroed so nothing of it leaks in the
region stream). The whole-image feature every text token carries is the intact image's (the
paper recomputes it from the image with the RoI's pixels zeroed, which precomputed features
cannot: ``task_batch.whole_image_feature``). Head:
Linear → GELU → Linear(H, C). Target: the detector's class. When the batch carries the
detector's distribution (``region_soft_labels``) the loss is the soft cross-entropy
−Σ_c p_c log q_c as in the reference; otherwise CE against ``region_class_labels``. Mean over
masked RoIs of true pairs.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from vlp.contract import batch_spec as bs
from vlp.contract.encoder_output import EncoderOutput
from vlp.tasks.losses import accuracy, region_targets, target_valid, weighted_mean, zero_loss
from vlp.tasks.masking_visual import SOFT_LABELS, choose_regions, mask_with_hard_labels
from vlp.tasks.mrc import classification_terms
from vlp.tasks.registry import register
from vlp.tasks.spec import ArrayBatch, Batch, HeadContext, MaskContext, Task


class RoIClassifier(nn.Module):
    def __init__(self, ctx: HeadContext):
        super().__init__()
        h = ctx.hidden_size
        self.net = nn.Sequential(nn.Linear(h, h), nn.GELU(), nn.Linear(h, ctx.num_classes))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.net(hidden)


@register
class MaskedRoIClassification(Task):
    name, label, order = "mrc-vlbert", "MRC-VLBERT", 6
    head_name = "mrc_vlbert"
    modality = "regions"
    visual = frozenset({"regions"})
    families = frozenset({"vlbert"})
    needs_soft_labels = True
    image_feat = True

    def mask(self, batch: ArrayBatch, rng: np.random.Generator, ctx: MaskContext) -> None:
        masked = choose_regions(batch, rng, ctx)
        mask_with_hard_labels(batch, masked, masked)
        if SOFT_LABELS in batch:   # the reference's target: the detector's distribution
            batch[bs.REGION_SOFT_LABELS] = batch[SOFT_LABELS]

    def build_head(self, ctx: HeadContext) -> nn.Module:
        return RoIClassifier(ctx)

    def compute(self, head: nn.Module, enc: EncoderOutput, batch: Batch) -> dict[str, torch.Tensor]:
        soft = batch.get(bs.REGION_SOFT_LABELS)
        if soft is None:
            return classification_terms(self.name, head, enc, batch)
        targets = region_targets(enc, batch, self.name)   # [2, M], M known on the host
        if targets.shape[1] == 0:
            return {"mrc-vlbert_loss": zero_loss(enc), "mrc-vlbert_acc": zero_loss(enc).detach()}
        logits = head(enc.regions_at(targets)).float()
        target = soft[targets[0], targets[1]].float()
        valid = target_valid(batch, bs.REGION_TARGETS)
        loss = weighted_mean(-(target * F.log_softmax(logits, dim=-1)).sum(-1), valid)
        return {"mrc-vlbert_loss": loss,
                "mrc-vlbert_acc": accuracy(logits, target.argmax(-1), valid)}
