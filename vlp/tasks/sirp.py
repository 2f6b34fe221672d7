"""SIRP: VL-BERT's sentence-image relationship prediction (§3.3, Task #1). A randomly
initialised classifier on the [CLS] output (the pooled [CLS], as VL-BERT's pretraining head
reads it) gives one logit for [Related]; sigmoid cross-entropy against the pair's label.
No masking; half of the pairs get a caption "randomly chosen from the whole dataset": negatives
swap the *text* only, never the image. UNITER's ITM is a two-way softmax instead, and swaps
images as well as texts."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from vlp.contract import batch_spec as bs
from vlp.contract.batch_access import require
from vlp.contract.encoder_output import EncoderOutput
from vlp.tasks.losses import row_valid, weighted_mean
from vlp.tasks.registry import register
from vlp.tasks.spec import Batch, HeadContext, Task


@register
class SentenceImageRelationship(Task):
    name, label, order = "sirp", "SIRP", 10
    head_name = "sirp"
    modality = None
    visual = frozenset({"regions"})
    families = frozenset({"vlbert"})
    itm_negatives = True
    negatives_swap = "text"
    image_feat = True
    needs_pooled = True

    def build_head(self, ctx: HeadContext) -> nn.Module:
        return nn.Linear(ctx.hidden_size, 1)

    def compute(self, head: nn.Module, enc: EncoderOutput, batch: Batch) -> dict[str, torch.Tensor]:
        related = require(batch, bs.ITM_LABELS, self.name).float()     # 1 = [Related]
        logit = head(enc.pooled_output).squeeze(-1).float()
        valid = row_valid(batch)
        bce = F.binary_cross_entropy_with_logits(logit, related, reduction="none")
        return {"sirp_loss": weighted_mean(bce, valid),
                "sirp_acc": weighted_mean(((logit.detach() > 0).float() == related).float(),
                                          valid)}
