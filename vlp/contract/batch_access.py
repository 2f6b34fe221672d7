"""Reading the batch contract (:mod:`vlp.contract.batch_spec`) with errors that name the key."""

from __future__ import annotations

from typing import Any, Mapping

import torch

from vlp.contract import batch_spec as bs


class BatchError(KeyError):
    """A batch lacks a key (or has a wrong shape) that the family or task needs."""

    def __str__(self) -> str:  # KeyError quotes its argument; we want a plain sentence
        return str(self.args[0])


def require(batch: Mapping[str, torch.Tensor], key: str, who: str) -> torch.Tensor:
    try:
        return batch[key]
    except KeyError:
        raise BatchError(f"{who} needs batch key {key!r} (see vlp/contract/batch_spec.py); "
                         f"the batch has {sorted(batch)}") from None


def check_last_dim(tensor: torch.Tensor, key: str, expected: int, who: str) -> None:
    if tensor.shape[-1] != expected:
        raise BatchError(f"{who}: batch key {key!r} has last dimension {tensor.shape[-1]}, "
                         f"expected {expected}")


def positive_pairs(batch: Mapping[str, torch.Tensor], batch_size: int,
                   device: torch.device) -> torch.Tensor:
    """bool [B]: masked-modeling losses count only true pairs (UNITER, ImageBERT, SOHO).
    A batch without the key is all true pairs (no ITM negatives were drawn)."""
    positive = batch.get(bs.POSITIVE)
    if positive is None:
        return torch.ones(batch_size, dtype=torch.bool, device=device)
    return positive.to(device=device, dtype=torch.bool)


def host_rows(batch: Mapping[str, Any], rows: int | None = None) -> tuple[int, bool] | None:
    """(packed row length, whether any row is padded) from the batch's host integers
    (``ROW_LENGTH``, ``REAL_UNITS``, Python ints from the prefetcher), for a batch of
    ``rows`` rows (default: its text's); None where it carries no row length. What the model
    decides on the host from them (its packed width, whether to mask padding), so a captured
    step holds only for batches that agree on it. A pixel batch counts as padded: the cells
    of a smaller image are padding the host does not see."""
    row = batch.get(bs.ROW_LENGTH)
    if row is None:
        return None
    real = batch.get(bs.REAL_UNITS)
    rows = batch[bs.INPUT_IDS].shape[0] if rows is None else rows
    padded = bs.PIXELS in batch or real is None or int(real) != rows * int(row)
    return int(row), padded
