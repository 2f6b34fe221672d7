"""VL-BERT's masked RoI classification with linguistic clues.

A masked RoI's visual feature is replaced by a learned embedding (the model adds it on the
rows flagged ``region_zeroed``; the input row is zeroed so nothing of it leaks), and the
whole-image feature that VL-BERT adds to every token is recomputed without the masked RoIs
(done after masking for every batch that carries ``image_feat``)."""

from __future__ import annotations

import numpy as np

from vlp.contract import batch_spec as K
from vlp.tasks.masking.registry import Batch, MaskContext, MaskingPolicy, register_policy
from vlp.tasks.masking.regions import choose_regions, hard_labels, zero_regions


def mask_mrc_vlbert(batch: Batch, rng: np.random.Generator, ctx: MaskContext) -> None:
    masked = choose_regions(batch, rng, ctx)
    zero_regions(batch, masked)
    batch[K.REGION_MASKED] = masked
    batch[K.REGION_CLASS_LABELS] = hard_labels(batch, masked)


MRC_VLBERT = register_policy(MaskingPolicy("mrc-vlbert", "regions", frozenset({"regions"}),
                                           mask_mrc_vlbert, needs_soft_labels=True,
                                           image_feat=True))
