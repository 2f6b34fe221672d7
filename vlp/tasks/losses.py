"""Loss helpers shared by the task files."""

from __future__ import annotations

import torch

from vlp.contract import batch_spec as bs
from vlp.contract.batch_access import positive_pairs, require
from vlp.contract.encoder_output import EncoderOutput
from vlp.tasks.spec import Batch


def zero_loss(enc: EncoderOutput) -> torch.Tensor:
    """A zero that stays on the graph: a batch with nothing to predict (e.g. only negative
    pairs) must still give every rank a finite loss and a backward pass."""
    return enc.sequence_output.sum() * 0.0


def accuracy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    if labels.numel() == 0:
        return logits.new_zeros(())
    return (logits.detach().argmax(-1) == labels).float().mean()


def masked_regions(enc: EncoderOutput, batch: Batch, who: str) -> torch.Tensor:
    """bool [B, N]: regions whose loss counts — masked, real, and in a true pair."""
    masked = require(batch, bs.REGION_MASKED, who).bool()
    positive = positive_pairs(batch, masked.shape[0], masked.device)
    return masked & enc.region_mask & positive[:, None]
