"""ITM: does the text match the image? Linear(H, 2) on the pooled [CLS]; CE over all pairs.
No masking; the batch draws swapped negatives (``vlp.datasets.batching.itm_negatives``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from vlp.contract import batch_spec as bs
from vlp.contract.batch_access import require
from vlp.contract.encoder_output import EncoderOutput
from vlp.tasks.losses import accuracy, row_valid, weighted_mean
from vlp.tasks.registry import register
from vlp.tasks.spec import Batch, HeadContext, Task


def itm_logits(head: nn.Module, enc: EncoderOutput) -> torch.Tensor:
    """[B, 2] (column 1 = "match"; retrieval scores with it)."""
    return head(enc.pooled_output)


def itm_terms(head: nn.Module, enc: EncoderOutput, batch: Batch) -> dict[str, torch.Tensor]:
    labels = require(batch, bs.ITM_LABELS, "itm").long()
    logits = itm_logits(head, enc)
    valid = row_valid(batch)
    return {"itm_loss": weighted_mean(F.cross_entropy(logits.float(), labels, reduction="none"),
                                      valid),
            "itm_acc": accuracy(logits, labels, valid)}


@register
class ImageTextMatching(Task):
    name, label, order = "itm", "ITM", 1
    head_name = "itm"
    modality = None
    visual = frozenset({"regions", "pixels"})
    itm_negatives = True
    needs_pooled = True

    def build_head(self, ctx: HeadContext) -> nn.Module:
        return nn.Linear(ctx.hidden_size, 2)

    def compute(self, head: nn.Module, enc: EncoderOutput, batch: Batch) -> dict[str, torch.Tensor]:
        return itm_terms(head, enc, batch)
