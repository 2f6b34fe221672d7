"""Small synthetic photos and extraction settings for the tiny BUTD detector's tests."""

from __future__ import annotations

import numpy as np

from vlp.models.vision.extractors.base import ExtractSettings

SETTINGS = ExtractSettings(min_boxes=10, max_boxes=20, short_side=96, long_side=160)


def synthetic_image(h: int, w: int, seed: int) -> np.ndarray:
    """A gradient with a few flat rectangles: edges for the RPN to find."""
    rng = np.random.default_rng(seed)
    img = np.zeros((h, w, 3), np.uint8)
    img[:] = (np.linspace(0, 200, w)[None, :, None] + rng.integers(0, 40, 3)).astype(np.uint8)
    for _ in range(4):
        y0, x0 = rng.integers(0, h - 10), rng.integers(0, w - 10)
        img[y0:y0 + rng.integers(5, h // 2), x0:x0 + rng.integers(5, w // 2)] = \
            rng.integers(0, 255, 3)
    return img
