"""ITM negatives (UNITER): each pair becomes a negative with probability p by swapping in the
image (or, half of the time, the text) of another example of the batch whose image differs.

Swapping within the batch keeps the batch's padded sizes, so the input-unit budget holds. An
image is never paired with one of its own captions as a "negative": donors are checked by
image identity, not by position (an image can appear twice in a batch with two captions).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vlp.datasets.collate import ExampleRefs

DONOR_TRIES = 4


@dataclass(frozen=True)
class ItmDraw:
    refs: ExampleRefs
    negative: np.ndarray     # bool [B]
    no_donor: int            # pairs drawn as negatives that had no other image to swap in


def draw_negatives(refs: ExampleRefs, image_keys: np.ndarray, neg_prob: float,
                   rng: np.random.Generator) -> ItmDraw:
    """``image_keys[i]``: identity of example i's image (its caption belongs to it)."""
    B = len(refs)
    want = rng.random(B) < neg_prob
    donor = np.full(B, -1, dtype=np.int64)
    todo = np.flatnonzero(want)
    for _ in range(DONOR_TRIES):   # random donors first: cheap and unbiased
        if not len(todo) or B < 2:
            break
        cand = (todo + rng.integers(1, B, size=len(todo))) % B   # never the example itself
        ok = image_keys[cand] != image_keys[todo]
        donor[todo[ok]] = cand[ok]
        todo = todo[~ok]
    for i in todo:                 # rare: most of the batch shares this image
        others = np.flatnonzero(image_keys != image_keys[i])
        if len(others):
            donor[i] = rng.choice(others)
    negative = donor >= 0
    idx = np.flatnonzero(negative)
    swap_image = rng.random(len(idx)) < 0.5
    img_i, txt_i = idx[swap_image], idx[~swap_image]
    image_block, image_row = refs.image_block.copy(), refs.image_row.copy()
    text_block, text_row, text_cap = refs.text_block.copy(), refs.text_row.copy(), \
        refs.text_cap.copy()
    image_block[img_i], image_row[img_i] = refs.image_block[donor[img_i]], \
        refs.image_row[donor[img_i]]
    text_block[txt_i], text_row[txt_i], text_cap[txt_i] = refs.text_block[donor[txt_i]], \
        refs.text_row[donor[txt_i]], refs.text_cap[donor[txt_i]]
    new = ExampleRefs(text_block, text_row, text_cap, image_block, image_row,
                      positive=refs.positive & ~negative)
    return ItmDraw(new, negative, int(want.sum() - negative.sum()))
