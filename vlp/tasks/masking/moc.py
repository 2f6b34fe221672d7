"""ImageBERT's masked object classification: of the 15% masked regions, 90% are zeroed and
10% keep their feature (BERT's "unchanged" share); the target is the detector's class."""

from __future__ import annotations

import numpy as np

from vlp.contract import batch_spec as K
from vlp.tasks.masking.registry import Batch, MaskContext, MaskingPolicy, register_policy
from vlp.tasks.masking.regions import choose_regions, hard_labels, zero_regions

ZERO_SHARE = 0.9


def mask_moc(batch: Batch, rng: np.random.Generator, ctx: MaskContext) -> None:
    masked = choose_regions(batch, rng, ctx)
    zero_regions(batch, masked & (rng.random(masked.shape) < ZERO_SHARE))
    batch[K.REGION_MASKED] = masked
    batch[K.REGION_CLASS_LABELS] = hard_labels(batch, masked)


MOC = register_policy(MaskingPolicy("moc", "regions", frozenset({"regions"}), mask_moc,
                                    needs_soft_labels=True))
