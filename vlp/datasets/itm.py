"""ITM negatives (UNITER): each pair becomes a negative with probability p by swapping in the
image (or, half of the time, the text) of another example of the batch whose image differs.

An image is never paired with one of its own captions as a "negative": donors are checked by
image identity, not by position (an image can appear twice in a batch with two captions).

Negatives must not be tellable from their lengths. A donor is therefore taken, whenever the
batch has one, with the same number of regions (image swap) or text tokens (text swap) as
the example it replaces, so the negative keeps the example's own (text, regions) lengths and
packed width: negatives and positives then have the same length distribution, and the
input-unit budget holds unchanged. Only when no such donor exists does the swap fall back to
any donor whose new pair fits the batch's longest row (counted in ``length_mismatch``).

Why it matters, measured on the demo world (uniter-tiny, ITM alone, 1,500 steps): when donors
were only required to *fit* the row, swapped-in texts and images were shorter than average,
and a model shown *no image at all* reached 0.62 ITM accuracy from lengths alone; the same
model with images reached the same 0.62: it learned the cue instead of matching.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vlp.datasets.collate import ExampleRefs


@dataclass(frozen=True)
class ItmDraw:
    refs: ExampleRefs
    negative: np.ndarray     # bool [B]
    no_donor: int            # pairs drawn as negatives that found no image to swap in
    length_mismatch: int = 0  # negatives whose donor changed the pair's lengths (fallback)


def draw_negatives(refs: ExampleRefs, image_keys: np.ndarray, text_len: np.ndarray,
                   visual_len: np.ndarray, neg_prob: float, rng: np.random.Generator
                   ) -> ItmDraw:
    """``image_keys[i]``: identity of example i's image (its caption belongs to it);
    ``text_len``/``visual_len``: its text tokens and regions."""
    B = len(refs)
    keys = np.asarray(image_keys)
    T, N = np.asarray(text_len), np.asarray(visual_len)
    width = int((T + N).max()) if B else 0
    want = rng.random(B) < neg_prob
    swap_image = rng.random(B) < 0.5
    donor = np.full(B, -1, dtype=np.int64)
    mismatched = 0
    for i in np.flatnonzero(want):      # B is a few hundred at most: a row scan per negative
        differs = keys != keys[i]
        exact_img, exact_txt = differs & (N == N[i]), differs & (T == T[i])
        fit_img, fit_txt = differs & (T[i] + N <= width), differs & (T + N[i] <= width)
        pref, other = bool(swap_image[i]), not swap_image[i]
        for use_img, pool, exact in ((pref, exact_img if pref else exact_txt, True),
                                     (other, exact_img if other else exact_txt, True),
                                     (pref, fit_img if pref else fit_txt, False),
                                     (other, fit_img if other else fit_txt, False)):
            cand = np.flatnonzero(pool)
            if len(cand):
                donor[i], swap_image[i] = rng.choice(cand), use_img
                mismatched += not exact
                break
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
    return ItmDraw(new, negative, int(want.sum() - negative.sum()), mismatched)
