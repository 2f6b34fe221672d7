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

Why it matters: when donors were only required to *fit* the row, swapped-in texts and images
were shorter than average, and a model shown no image at all could tell negatives from their
lengths (docs/benchmarks.md: "ITM from lengths alone").
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vlp.datasets.batching.collate import ExampleRefs


@dataclass(frozen=True)
class Donors:
    """Which examples become negatives and where their swapped-in side comes from."""
    donor: np.ndarray        # int64 [B]: the example lending its image or text; -1 = positive
    swap_image: np.ndarray   # bool [B]: the image is swapped in (else the text)
    no_donor: int            # pairs drawn as negatives that found no image to swap in
    length_mismatch: int     # negatives whose donor changed the pair's lengths (fallback)

    @property
    def negative(self) -> np.ndarray:
        return self.donor >= 0

    def image_swaps(self) -> tuple[np.ndarray, np.ndarray]:
        """(examples whose image is replaced, their donors)."""
        idx = np.flatnonzero(self.negative & self.swap_image)
        return idx, self.donor[idx]

    def text_swaps(self) -> tuple[np.ndarray, np.ndarray]:
        idx = np.flatnonzero(self.negative & ~self.swap_image)
        return idx, self.donor[idx]


def choose_donors(image_keys: np.ndarray, text_len: np.ndarray, visual_len: np.ndarray,
                  neg_prob: float, rng: np.random.Generator, text_only: bool = False) -> Donors:
    """``image_keys[i]``: identity of example i's image (its caption belongs to it);
    ``text_len``/``visual_len``: its text tokens and regions. ``text_only``: negatives take
    their donor's caption, never its image (VL-BERT's sentence-image relationship)."""
    keys = np.asarray(image_keys)
    T, N = np.asarray(text_len), np.asarray(visual_len)
    B = len(keys)
    width = int((T + N).max()) if B else 0
    want = rng.random(B) < neg_prob
    swap_image = rng.random(B) < 0.5
    if text_only:   # (the draw above still happens: the generator's stream stays ITM's)
        swap_image[:] = False
    donor = np.full(B, -1, dtype=np.int64)
    todo = np.flatnonzero(want)
    mismatched = 0
    if len(todo):
        # [M, B] candidate masks for the M pairs to turn negative, in order of preference
        differs = keys[todo, None] != keys[None, :]
        exact_img = differs & (N[todo, None] == N[None, :])
        exact_txt = differs & (T[todo, None] == T[None, :])
        fit_img = differs & (T[todo, None] + N[None, :] <= width)
        fit_txt = differs & (T[None, :] + N[todo, None] <= width)
        pref = swap_image[todo, None]
        levels = ((np.where(pref, exact_img, exact_txt), pref[:, 0], True),
                  (np.where(pref, exact_txt, exact_img), ~pref[:, 0], True),
                  (np.where(pref, fit_img, fit_txt), pref[:, 0], False),
                  (np.where(pref, fit_txt, fit_img), ~pref[:, 0], False))
        if text_only:
            levels = (levels[0], levels[2])       # pref is all False: the text levels
        # argmax of iid uniforms over a mask = a uniform choice among its candidates
        noise = rng.random((len(todo), B))
        chosen = np.full(len(todo), -1, dtype=np.int64)
        for mask, use_img, exact in levels:
            j = np.where(mask, noise, -1.0).argmax(1)
            take = (chosen < 0) & mask.any(1)
            chosen[take] = j[take]
            swap_image[todo[take]] = use_img[take]
            mismatched += 0 if exact else int(take.sum())
        donor[todo] = chosen
    return Donors(donor, swap_image, int(want.sum() - (donor >= 0).sum()), mismatched)


def apply_donors(refs: ExampleRefs, d: Donors) -> ExampleRefs:
    """The references with each negative's image (or text) taken from its donor."""
    img_i, img_d = d.image_swaps()
    txt_i, txt_d = d.text_swaps()
    image_block, image_row = refs.image_block.copy(), refs.image_row.copy()
    text_block, text_row, text_cap = (refs.text_block.copy(), refs.text_row.copy(),
                                      refs.text_cap.copy())
    image_block[img_i], image_row[img_i] = refs.image_block[img_d], refs.image_row[img_d]
    text_block[txt_i], text_row[txt_i], text_cap[txt_i] = (refs.text_block[txt_d],
                                                           refs.text_row[txt_d],
                                                           refs.text_cap[txt_d])
    return ExampleRefs(text_block, text_row, text_cap, image_block, image_row,
                       positive=refs.positive & ~d.negative)
