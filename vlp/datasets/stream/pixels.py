"""SOHO's pixel input: decode + aspect-preserving resize (in the Ray Data map, where the CPU
work parallelises), then normalise + pad + pixel mask per batch (in the worker)."""

from __future__ import annotations

import io

import numpy as np
from PIL import Image

from vlp.datasets.stream.data_config import PixelConfig


def resized_size(h: int, w: int, cfg: PixelConfig) -> tuple[int, int]:
    """Shorter side → ``shorter_side`` unless the longer side would pass ``longer_max``."""
    scale = cfg.shorter_side / min(h, w)
    if max(h, w) * scale > cfg.longer_max:
        scale = cfg.longer_max / max(h, w)
    return max(1, round(h * scale)), max(1, round(w * scale))


def decode_resize(blob: bytes, cfg: PixelConfig) -> np.ndarray:
    """Encoded image → uint8 [h, w, 3]."""
    with Image.open(io.BytesIO(blob)) as im:
        im = im.convert("RGB")
        h, w = resized_size(im.height, im.width, cfg)
        if (h, w) != (im.height, im.width):
            im = im.resize((w, h), Image.BILINEAR)
        return np.asarray(im, dtype=np.uint8)


def pad_images(images: list[np.ndarray], cfg: PixelConfig) -> tuple[np.ndarray, np.ndarray]:
    """uint8 [h, w, 3] images → normalised float32 [I, 3, H, W] and pixel mask long [I, H, W],
    H and W the largest sizes rounded up to the CNN stride."""
    m = cfg.pad_multiple
    H = -(-max(im.shape[0] for im in images) // m) * m
    W = -(-max(im.shape[1] for im in images) // m) * m
    out = np.zeros((len(images), 3, H, W), dtype=np.float32)
    mask = np.zeros((len(images), H, W), dtype=np.int64)
    mean = np.asarray(cfg.mean, np.float32)[:, None, None]
    std = np.asarray(cfg.std, np.float32)[:, None, None]
    for i, im in enumerate(images):
        h, w = im.shape[:2]
        out[i, :, :h, :w] = (im.transpose(2, 0, 1).astype(np.float32) / 255.0 - mean) / std
        mask[i, :h, :w] = 1
    return out, mask


def visual_tokens(h: int, w: int, cfg: PixelConfig) -> int:
    """Visual tokens of a padded h×w image after the CNN (counts input units)."""
    s = cfg.token_stride
    return (-(-h // s)) * (-(-w // s))
