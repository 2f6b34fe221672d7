"""Masked RoI classification with linguistic clues (VL-BERT).

The masked RoI's visual feature embedding is replaced by a learned embedding (the embedder
does it for ``region_zeroed`` rows) and the whole-image feature that every text token carries
is recomputed by the pipeline without it, so the class must come from the text. Head:
Linear → GELU → Linear(H, C). Target: the detector's class. When the batch carries the
detector's distribution (``region_soft_labels``) the loss is the soft cross-entropy
−Σ_c p_c log q_c as in the reference; otherwise CE against ``region_class_labels``. Mean over
masked RoIs of true pairs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from vlp.contract import batch_spec as bs

from vlp.contract.encoder_output import EncoderOutput
from vlp.tasks.base import Batch, HeadContext, Task, accuracy, masked_regions, register_task, zero_loss
from vlp.tasks.mrc import classification_terms


class RoIClassifier(nn.Module):
    def __init__(self, ctx: HeadContext):
        super().__init__()
        h = ctx.hidden_size
        self.net = nn.Sequential(nn.Linear(h, h), nn.GELU(), nn.Linear(h, ctx.num_classes))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.net(hidden)


@register_task
class MaskedRoIClassification(Task):
    name = "mrc-vlbert"
    head_name = "mrc_vlbert"

    def build_head(self, ctx: HeadContext) -> nn.Module:
        return RoIClassifier(ctx)

    def compute(self, head: nn.Module, enc: EncoderOutput, batch: Batch) -> dict[str, torch.Tensor]:
        soft = batch.get(bs.REGION_SOFT_LABELS)
        if soft is None:
            return classification_terms(self.name, head, enc, batch)
        select = masked_regions(enc, batch, self.name)
        if not select.any():
            return {"mrc-vlbert_loss": zero_loss(enc), "mrc-vlbert_acc": zero_loss(enc).detach()}
        logits = head(enc.select_regions(select)).float()
        target = soft[select].float()
        loss = -(target * F.log_softmax(logits, dim=-1)).sum(-1).mean()
        return {"mrc-vlbert_loss": loss, "mrc-vlbert_acc": accuracy(logits, target.argmax(-1))}
