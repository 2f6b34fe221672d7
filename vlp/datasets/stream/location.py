"""Region location features per model family, a registry by name.

Each entry maps pixel boxes ``[K, 4]`` (x1, y1, x2, y2) and the image sizes ``[K]`` to a
``[K, L]`` float32 array. Coordinates are normalised by the image size and clipped to [0, 1]
(detectors may put a corner up to one pixel outside the image).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np


@dataclass(frozen=True)
class LocationFeature:
    width: int
    fn: Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]


def _normalised(boxes: np.ndarray, w: np.ndarray, h: np.ndarray) -> np.ndarray:
    scale = np.stack([w, h, w, h], axis=1).astype(np.float32)
    return np.clip(boxes.astype(np.float32) / np.maximum(scale, 1), 0.0, 1.0)


def uniter_location(boxes, w, h) -> np.ndarray:
    """UNITER 7-d: [x1, y1, x2, y2, w, h, w*h], all normalised."""
    b = _normalised(boxes, w, h)
    bw, bh = b[:, 2] - b[:, 0], b[:, 3] - b[:, 1]
    return np.concatenate([b, bw[:, None], bh[:, None], (bw * bh)[:, None]], axis=1)


def imagebert_location(boxes, w, h) -> np.ndarray:
    """ImageBERT 5-d: [x1/W, y1/H, x2/W, y2/H, box area / image area]."""
    b = _normalised(boxes, w, h)
    area = (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
    return np.concatenate([b, area[:, None]], axis=1)


def vlbert_location(boxes, w, h) -> np.ndarray:
    """VL-BERT 4-d normalised box; the model computes the sine geometry embedding from it."""
    return _normalised(boxes, w, h)


# names as in the models' PreprocessSpec.location_kind
LOCATION_FEATURES: dict[str, LocationFeature] = {
    "uniter7": LocationFeature(7, uniter_location),
    "imagebert5": LocationFeature(5, imagebert_location),
    "box4": LocationFeature(4, vlbert_location),
}
LOCATION_ALIASES = {"uniter": "uniter7", "imagebert": "imagebert5", "vlbert": "box4"}


def location_kind(name: str) -> str:
    """The registry name for ``name`` or its family alias (unknown names pass through)."""
    return LOCATION_ALIASES.get(name, name)
