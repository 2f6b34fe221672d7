"""The CPU-side preparation every CNN extractor shares: resize per the settings, ImageNet
normalisation, HWC uint8 → CHW float32."""

from __future__ import annotations

import numpy as np
from PIL import Image

from vlp.models.vision.extractors.base import ExtractSettings, resized_hw

IMAGENET_MEAN = np.asarray([0.485, 0.456, 0.406], np.float32)
IMAGENET_STD = np.asarray([0.229, 0.224, 0.225], np.float32)


def resize_rgb(rgb: np.ndarray, settings: ExtractSettings) -> tuple[np.ndarray, float]:
    """HWC uint8 → (resized HWC uint8, scale); the scale is the one ``resized_hw`` chose, so
    boxes map back to the original pixels through one number."""
    h, w = rgb.shape[:2]
    rh, rw, scale = resized_hw(h, w, settings)
    if (rh, rw) == (h, w):
        return rgb, scale
    return np.asarray(Image.fromarray(rgb).resize((rw, rh), Image.BILINEAR)), scale


def normalised_chw(rgb: np.ndarray) -> np.ndarray:
    """HWC uint8 → CHW float32 with ImageNet's mean and std (torchvision weights expect it)."""
    x = rgb.astype(np.float32) / 255.0
    return np.ascontiguousarray(((x - IMAGENET_MEAN) / IMAGENET_STD).transpose(2, 0, 1))
