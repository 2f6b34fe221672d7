"""Visual masking shared by the MRM variants, MOC, VL-BERT's masked RoI, MVM and joint masking."""

from __future__ import annotations

import numpy as np

from vlp.contract import batch_spec as K
from vlp.tasks.masking_select import choose_positions
from vlp.tasks.spec import ArrayBatch as Batch, MaskContext

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


def mask_with_hard_labels(batch: Batch, masked: np.ndarray, zeroed: np.ndarray) -> None:
    """Zero the ``zeroed`` regions; the targets are the detector's class of the ``masked``."""
    zero_regions(batch, zeroed)
    batch[K.REGION_MASKED] = masked
    batch[K.REGION_CLASS_LABELS] = hard_labels(batch, masked)


def flag_mvm_images(batch: Batch, rng: np.random.Generator, ctx: MaskContext) -> None:
    """SOHO: masking by visual-dictionary index happens inside the model (the index exists only
    after the dictionary lookup); the pipeline flags the images on which the model masks one
    index: every image that is paired with at least one positive text."""
    images = batch[K.PIXELS].shape[0]
    has_positive = np.zeros(images, dtype=bool)
    has_positive[batch[K.IMAGE_INDEX][batch[K.POSITIVE]]] = True
    batch[K.MVM_APPLY] = has_positive
