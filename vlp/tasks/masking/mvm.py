"""SOHO's masked visual modeling. Masking by visual-dictionary index happens inside the model
(the index exists only after the dictionary lookup); the pipeline flags the images on which
the model masks one index: every image that is paired with at least one positive text."""

from __future__ import annotations

import numpy as np

from vlp.contract import batch_spec as K
from vlp.tasks.masking.registry import Batch, MaskContext, MaskingPolicy, register_policy


def flag_mvm_images(batch: Batch, rng: np.random.Generator, ctx: MaskContext) -> None:
    images = batch[K.PIXELS].shape[0]
    has_positive = np.zeros(images, dtype=bool)
    has_positive[batch[K.IMAGE_INDEX][batch[K.POSITIVE]]] = True
    batch[K.MVM_APPLY] = has_positive


MVM = register_policy(MaskingPolicy("mvm", "pixels", frozenset({"pixels"}), flag_mvm_images))
