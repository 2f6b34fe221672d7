"""Reading the batch contract (:mod:`vlp.contract.batch_spec`) with errors that name the key."""

from __future__ import annotations

from typing import Mapping

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
