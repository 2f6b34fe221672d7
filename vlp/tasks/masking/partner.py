"""Joint masking: mask the modality the task does not mask, in the same examples."""

from __future__ import annotations

import numpy as np

from vlp.tasks.masking.mvm import flag_mvm_images
from vlp.tasks.masking.registry import Batch, MaskContext
from vlp.tasks.masking.regions import choose_regions, zero_regions
from vlp.tasks.masking.text import mask_text


def mask_partner_modality(modality: str, batch: Batch, rng: np.random.Generator,
                          ctx: MaskContext, visual: str) -> None:
    if modality in ("regions", "pixels"):
        mask_text(batch, rng, ctx)                     # adds mlm_labels
    elif visual == "regions":
        zero_regions(batch, choose_regions(batch, rng, ctx))   # adds region_zeroed
    else:
        flag_mvm_images(batch, rng, ctx)               # adds mvm_apply
