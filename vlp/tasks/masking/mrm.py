"""UNITER's masked region modeling: MRFR, MRC and MRC-kl.

15% of the regions of each positive pair (at least one per image) get zero input features;
``region_masked`` marks where the loss is computed (here the same rows as ``region_zeroed``).
"""

from __future__ import annotations

import numpy as np

from vlp.contract import batch_spec as K
from vlp.tasks.masking.registry import Batch, MaskContext, MaskingPolicy, register_policy
from vlp.tasks.masking.regions import SOFT_LABELS, choose_regions, hard_labels, zero_regions


def mask_mrfr(batch: Batch, rng: np.random.Generator, ctx: MaskContext) -> None:
    masked = choose_regions(batch, rng, ctx)
    batch[K.REGION_FEAT_TARGETS] = batch[K.REGION_FEATS].copy()   # raw, not normalised
    zero_regions(batch, masked)
    batch[K.REGION_MASKED] = masked


def mask_mrc(batch: Batch, rng: np.random.Generator, ctx: MaskContext) -> None:
    masked = choose_regions(batch, rng, ctx)
    zero_regions(batch, masked)
    batch[K.REGION_MASKED] = masked
    batch[K.REGION_CLASS_LABELS] = hard_labels(batch, masked)


def mask_mrc_kl(batch: Batch, rng: np.random.Generator, ctx: MaskContext) -> None:
    masked = choose_regions(batch, rng, ctx)
    zero_regions(batch, masked)
    batch[K.REGION_MASKED] = masked
    batch[K.REGION_SOFT_LABELS] = batch[SOFT_LABELS]


_REGIONS = frozenset({"regions"})
MRFR = register_policy(MaskingPolicy("mrfr", "regions", _REGIONS, mask_mrfr))
MRC = register_policy(MaskingPolicy("mrc", "regions", _REGIONS, mask_mrc,
                                    needs_soft_labels=True))
MRC_KL = register_policy(MaskingPolicy("mrc-kl", "regions", _REGIONS, mask_mrc_kl,
                                       needs_soft_labels=True))
