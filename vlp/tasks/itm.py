"""ITM: does the text match the image? Linear(H, 2) on the pooled [CLS]; CE over all pairs."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from vlp.contract import batch_spec as bs

from vlp.contract.encoder_output import EncoderOutput
from vlp.tasks.base import Batch, HeadContext, Task, accuracy, register_task
from vlp.contract.batch_access import require


def itm_logits(head: nn.Module, enc: EncoderOutput) -> torch.Tensor:
    """[B, 2] (column 1 = "match"; retrieval scores with it)."""
    return head(enc.pooled_output)


def itm_terms(head: nn.Module, enc: EncoderOutput, batch: Batch) -> dict[str, torch.Tensor]:
    labels = require(batch, bs.ITM_LABELS, "itm").long()
    logits = itm_logits(head, enc)
    return {"itm_loss": F.cross_entropy(logits.float(), labels),
            "itm_acc": accuracy(logits, labels)}


@register_task
class ImageTextMatching(Task):
    name = "itm"
    head_name = "itm"
    needs_pooled = True

    def build_head(self, ctx: HeadContext) -> nn.Module:
        return nn.Linear(ctx.hidden_size, 2)

    def compute(self, head: nn.Module, enc: EncoderOutput, batch: Batch) -> dict[str, torch.Tensor]:
        return itm_terms(head, enc, batch)
