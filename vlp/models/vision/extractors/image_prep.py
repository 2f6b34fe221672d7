"""The CPU-side preparation every CNN extractor shares: resize per the settings, ImageNet
normalisation (on the model's device, from the uint8 image the CPU stage shipped)."""

from __future__ import annotations

import numpy as np
import torch
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


def normalised_chw(x: torch.Tensor) -> torch.Tensor:
    """HWC uint8 RGB (on the model's device) → CHW float32 with ImageNet's mean and std
    (torchvision weights expect it)."""
    mean = torch.as_tensor(IMAGENET_MEAN, device=x.device)[:, None, None]
    std = torch.as_tensor(IMAGENET_STD, device=x.device)[:, None, None]
    return (x.permute(2, 0, 1).float() / 255.0 - mean) / std
