"""The two masking modes, run by the data pipeline on an unmasked numpy batch, in place.

``conditional`` (UNITER): only the task's own modality is masked (ITM batches carry no
masking). ``joint`` (UNITER Table 3 line 11): a masked task's batch masks the other modality
too, at random in the same examples, so the task's targets are predicted without full
observation of the other side. Masked-modeling targets only ever fall on positive pairs.

A forward group (the ``summed`` objective's tasks that share one batch, ``apply_group_masking``)
masks each modality once: the group's first task of a modality draws the mask, a later task of
the same modality labels those positions (``Task.share_mask``). A group of a text task and a
region task is VL-BERT's joint masking (words and RoIs masked in the same example).
"""

from __future__ import annotations

from typing import Literal, Sequence

import numpy as np

from vlp.contract import batch_spec as K
from vlp.tasks.masking_text import mask_text
from vlp.tasks.masking_visual import choose_regions, flag_mvm_images, zero_regions
from vlp.tasks.registry import get_task
from vlp.tasks.spec import ArrayBatch, MaskContext


def apply_masking(task: str, batch: ArrayBatch, rng: np.random.Generator, ctx: MaskContext,
                  mode: Literal["conditional", "joint"], visual: str) -> None:
    spec = get_task(task)
    spec.mask(batch, rng, ctx)
    if mode == "joint" and spec.modality is not None:
        mask_partner_modality(spec.modality, batch, rng, ctx, visual)


def apply_group_masking(tasks: Sequence[str], batch: ArrayBatch, rng: np.random.Generator,
                        ctx: MaskContext, mode: Literal["conditional", "joint"],
                        visual: str) -> None:
    """Mask ``batch`` for every task of a forward group, each modality once."""
    if len(tasks) == 1:
        apply_masking(tasks[0], batch, rng, ctx, mode, visual)
        return
    raw = batch[K.REGION_FEATS].copy() if K.REGION_FEATS in batch else None
    masked: set[str] = set()
    for task in tasks:
        spec = get_task(task)
        if spec.modality is None:
            continue
        if spec.modality in masked:
            spec.share_mask(batch, raw)
        else:
            spec.mask(batch, rng, ctx)
            masked.add(spec.modality)
    if mode == "joint" and len(masked) == 1:
        mask_partner_modality(next(iter(masked)), batch, rng, ctx, visual)


def mask_partner_modality(modality: str, batch: ArrayBatch, rng: np.random.Generator,
                          ctx: MaskContext, visual: str) -> None:
    """Joint masking: mask the modality the task does not mask, in the same examples."""
    if modality in ("regions", "pixels"):
        mask_text(batch, rng, ctx)                     # adds mlm_labels
    elif visual == "regions":
        zero_regions(batch, choose_regions(batch, rng, ctx))   # adds region_zeroed
    else:
        flag_mvm_images(batch, rng, ctx)               # adds mvm_apply
