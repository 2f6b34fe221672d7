"""ITM's negatives swap the image or the text with equal odds (UNITER §3.1: "The negative pair
is created by replacing the image or text in a paired sample with a randomly-selected one
from other samples"; neither side is preferred). A sampler that always swaps the image trains
a model that only ever sees a caption with a foreign image, never an image with a foreign
caption.

Counted over many batches with a fixed seed, with every example's lengths alike so that a
same-length donor always exists on both sides (the swap side is then the coin's alone)."""

from __future__ import annotations

import numpy as np

from vlp.datasets.batching.itm_negatives import choose_donors


def test_itm_negatives_swap_image_or_text_half_and_half():
    rng = np.random.default_rng(0)
    B = 64
    keys = np.arange(B)                       # every example its own image
    T, N = np.full(B, 12), np.full(B, 30)
    image = text = 0
    for _ in range(100):
        d = choose_donors(keys, T, N, 0.5, rng)
        image += int((d.negative & d.swap_image).sum())
        text += int((d.negative & ~d.swap_image).sum())
    n = image + text
    # ~3,200 negatives: a fair coin's share has sd 0.0088; ±0.04 is > 4.5 sd
    assert 3000 < n < 3400
    assert abs(image / n - 0.5) < 0.04


def test_vlbert_sentence_image_negatives_swap_only_the_text():
    """VL-BERT (text_only): the unrelated pair's sentence is another example's, its image kept."""
    rng = np.random.default_rng(0)
    B = 64
    d = choose_donors(np.arange(B), np.full(B, 12), np.full(B, 30), 1.0, rng, text_only=True)
    assert d.negative.all() and not d.swap_image.any()
