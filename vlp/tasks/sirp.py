"""SIRP: VL-BERT's sentence-image relationship prediction (§3.3, Task #1). A randomly
initialised classifier on the [CLS] output (the pooled [CLS], as VL-BERT's pretraining head
reads it) gives one logit for [Related]; sigmoid cross-entropy against the pair's label.
Negatives are captions drawn from other images (``vlp.tasks.masking.sirp``). UNITER's ITM
is a two-way softmax instead, and swaps images as well as texts."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from vlp.contract import batch_spec as bs

from vlp.contract.encoder_output import EncoderOutput
from vlp.contract.batch_access import require
from vlp.tasks.base import Batch, HeadContext, Task, register_task


@register_task
class SentenceImageRelationship(Task):
    name = "sirp"
    head_name = "sirp"
    needs_pooled = True

    def build_head(self, ctx: HeadContext) -> nn.Module:
        return nn.Linear(ctx.hidden_size, 1)

    def compute(self, head: nn.Module, enc: EncoderOutput, batch: Batch) -> dict[str, torch.Tensor]:
        related = require(batch, bs.ITM_LABELS, self.name).float()     # 1 = [Related]
        logit = head(enc.pooled_output).squeeze(-1).float()
        return {"sirp_loss": F.binary_cross_entropy_with_logits(logit, related),
                "sirp_acc": ((logit.detach() > 0).float() == related).float().mean()}
