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


def accuracy(logits: torch.Tensor, labels: torch.Tensor,
             valid: torch.Tensor | None = None) -> torch.Tensor:
    if labels.numel() == 0:
        return logits.new_zeros(())
    return weighted_mean((logits.detach().argmax(-1) == labels).float(), valid)


def weighted_mean(values: torch.Tensor, valid: torch.Tensor | None) -> torch.Tensor:
    """The mean of ``values`` (one per row or target) over the ``valid`` ones: a batch padded
    to a fixed shape (``batch_spec.ROW_VALID`` and the targets' flags) gives the loss of its
    real entries, and 0 (with zero gradients) where it has none. No ``valid``: the mean."""
    if valid is None:
        return values.mean()
    keep = valid.to(device=values.device, dtype=torch.bool)
    return torch.where(keep, values, 0.0).sum() / keep.sum().clamp(min=1)


def row_valid(batch: Batch) -> torch.Tensor | None:
    """bool [B]: the real rows of a padded batch (None: every row is real)."""
    return batch.get(bs.ROW_VALID)


def target_valid(batch: Batch, key: str) -> torch.Tensor | None:
    """bool [M]: the real entries of MLM_TARGETS / REGION_TARGETS (None: all of them)."""
    return batch.get(bs.MLM_TARGET_VALID if key == bs.MLM_TARGETS else bs.REGION_TARGET_VALID)


def masked_regions(enc: EncoderOutput, batch: Batch, who: str) -> torch.Tensor:
    """bool [B, N]: regions whose loss counts — masked, real, and in a true pair."""
    masked = require(batch, bs.REGION_MASKED, who).bool()
    positive = positive_pairs(batch, masked.shape[0], masked.device)
    return masked & enc.region_mask & positive[:, None]


def text_targets(enc: EncoderOutput, batch: Batch, labels: torch.Tensor) -> torch.Tensor:
    """long [2, M]: (row, column) of the text tokens whose MLM loss counts — labelled, real,
    in a true pair. The pretraining collate computes them on the host (``MLM_TARGETS``); a
    batch built elsewhere gets them from the device (a host sync)."""
    targets = batch.get(bs.MLM_TARGETS)
    if targets is not None:
        return targets
    positive = positive_pairs(batch, labels.shape[0], labels.device)
    select = (labels != -100) & enc.text_mask & positive[:, None]
    return torch.stack(select.nonzero(as_tuple=True))


def region_targets(enc: EncoderOutput, batch: Batch, who: str,
                   labels: torch.Tensor | None = None) -> torch.Tensor:
    """long [2, M]: (row, column) of the regions whose loss counts — masked, real, in a true
    pair (and labelled, where ``labels`` are given). From the batch (``REGION_TARGETS``,
    computed on the host) where it has them; else from the device (a host sync)."""
    targets = batch.get(bs.REGION_TARGETS)
    if targets is not None:
        return targets
    select = masked_regions(enc, batch, who)
    if labels is not None:
        select = select & (labels != -100)
    return torch.stack(select.nonzero(as_tuple=True))
