"""BERT's token masking, shared by MLM and the text side of joint masking."""

from __future__ import annotations

import numpy as np

from vlp.contract import batch_spec as K
from vlp.tasks.masking_select import choose_positions
from vlp.tasks.spec import ArrayBatch as Batch, MaskContext

MASK_SHARE, RANDOM_SHARE = 0.8, 0.1   # of the masked tokens; the last 10% stay unchanged


def maskable_words(batch: Batch, ctx: MaskContext) -> np.ndarray:
    """The real word pieces of positive pairs: never [CLS]/[SEP]/[PAD], never a negative."""
    ids = batch[K.INPUT_IDS]
    return ((batch[K.TEXT_MASK] == 1) & (ids != ctx.cls_id) & (ids != ctx.sep_id)
            & batch[K.POSITIVE][:, None])


def mask_text(batch: Batch, rng: np.random.Generator, ctx: MaskContext) -> None:
    """15% of the real word pieces of positive pairs (never [CLS]/[SEP]/[PAD]); of those 80%
    → [MASK], 10% → a random token, 10% unchanged. Sets ``mlm_labels`` (-100 elsewhere)."""
    corrupt_chosen(batch, choose_positions(maskable_words(batch, ctx), ctx.mask_prob, rng),
                   rng, ctx)


def corrupt_chosen(batch: Batch, chosen: np.ndarray, rng: np.random.Generator,
                   ctx: MaskContext) -> None:
    """BERT's 80/10/10 corruption of the ``chosen`` positions; sets ``mlm_labels``."""
    ids = batch[K.INPUT_IDS]
    labels = np.where(chosen, ids, -100)
    r = rng.random(ids.shape)
    masked_ids = ids.copy()
    masked_ids[chosen & (r < MASK_SHARE)] = ctx.mask_id
    swap = chosen & (r >= MASK_SHARE) & (r < MASK_SHARE + RANDOM_SHARE)
    masked_ids[swap] = rng.choice(ctx.random_ids, size=int(swap.sum()))
    batch[K.INPUT_IDS] = masked_ids
    batch[K.MLM_LABELS] = labels
