"""Region masking shared by the MRM variants, MOC, VL-BERT's masked RoI and joint masking."""

from __future__ import annotations

import numpy as np

from vlp.contract import batch_spec as K
from vlp.tasks.masking.registry import Batch, MaskContext
from vlp.tasks.masking.select import choose_positions

SOFT_LABELS = "_soft_labels"   # internal key: detector distributions [B, N, C], fp16


def choose_regions(batch: Batch, rng: np.random.Generator, ctx: MaskContext) -> np.ndarray:
    """15% of the real regions of positive pairs, at least one per image."""
    eligible = (batch[K.REGION_MASK] == 1) & batch[K.POSITIVE][:, None]
    return choose_positions(eligible, ctx.mask_prob, rng)


def zero_regions(batch: Batch, zeroed: np.ndarray) -> None:
    """UNITER: a masked region's input feature is all zeros (the model may add its learned
    mask embedding on the rows flagged in ``region_zeroed``)."""
    batch[K.REGION_FEATS][zeroed] = 0.0
    batch[K.REGION_ZEROED] = zeroed


def hard_labels(batch: Batch, masked: np.ndarray) -> np.ndarray:
    """The detector's class: argmax over classes 1..C-1 (0 = background never wins), -100
    where the region is not masked."""
    soft = batch[SOFT_LABELS]
    label = soft[..., 1:].argmax(axis=-1) + 1
    return np.where(masked, label, -100).astype(np.int64)
