"""ITM negatives (UNITER): each pair becomes a negative with probability p by swapping in the
image (or, half of the time, the text) of another example of the batch whose image differs.

An image is never paired with one of its own captions as a "negative": donors are checked by
image identity, not by position (an image can appear twice in a batch with two captions).
Swaps stay within the batch and only where the new pair's packed length (text + regions) fits
the batch's longest row, so the input-unit budget still holds; when the preferred swap does
not fit, the other direction is used.
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
    no_donor: int            # pairs drawn as negatives that found no image to swap in


def draw_negatives(refs: ExampleRefs, image_keys: np.ndarray, text_len: np.ndarray,
                   visual_len: np.ndarray, neg_prob: float, rng: np.random.Generator
                   ) -> ItmDraw:
    """``image_keys[i]``: identity of example i's image (its caption belongs to it);
    ``text_len``/``visual_len``: its text tokens and regions."""
    B = len(refs)
    T, N = np.asarray(text_len), np.asarray(visual_len)
    width = int((T + N).max()) if B else 0
    want = rng.random(B) < neg_prob
    swap_image = rng.random(B) < 0.5
    donor = np.full(B, -1, dtype=np.int64)
    todo = np.flatnonzero(want)
    for _ in range(DONOR_TRIES):   # random donors first: cheap and unbiased
        if not len(todo) or B < 2:
            break
        cand = (todo + rng.integers(1, B, size=len(todo))) % B   # never the example itself
        differs = image_keys[cand] != image_keys[todo]
        fit_img, fit_txt = T[todo] + N[cand] <= width, T[cand] + N[todo] <= width
        pref = np.where(swap_image[todo], fit_img, fit_txt)
        other = np.where(swap_image[todo], fit_txt, fit_img)
        ok = differs & (pref | other)
        flip = ok & ~pref
        swap_image[todo[flip]] = ~swap_image[todo[flip]]
        donor[todo[ok]] = cand[ok]
        todo = todo[~ok]
    for i in todo:                 # rare: most of the batch shares this image, or lengths
        differs = image_keys != image_keys[i]
        fit_img, fit_txt = differs & (T[i] + N <= width), differs & (T + N[i] <= width)
        if fit_img.any() or fit_txt.any():
            use_img = fit_img.any() if not fit_txt.any() else (
                swap_image[i] if fit_img.any() else False)
            donor[i] = rng.choice(np.flatnonzero(fit_img if use_img else fit_txt))
            swap_image[i] = use_img
    negative = donor >= 0
    idx = np.flatnonzero(negative)
    img_i, txt_i = idx[swap_image[idx]], idx[~swap_image[idx]]
    image_block, image_row = refs.image_block.copy(), refs.image_row.copy()
    text_block, text_row, text_cap = (refs.text_block.copy(), refs.text_row.copy(),
                                      refs.text_cap.copy())
    image_block[img_i], image_row[img_i] = refs.image_block[donor[img_i]], \
        refs.image_row[donor[img_i]]
    text_block[txt_i], text_row[txt_i], text_cap[txt_i] = refs.text_block[donor[txt_i]], \
        refs.text_row[donor[txt_i]], refs.text_cap[donor[txt_i]]
    new = ExampleRefs(text_block, text_row, text_cap, image_block, image_row,
                      positive=refs.positive & ~negative)
    return ItmDraw(new, negative, int(want.sum() - negative.sum()))
