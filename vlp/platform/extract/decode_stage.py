"""The CPU stage of the job: read an image's bytes, decode, apply its EXIF orientation, and
let the extractor prepare its model input (resize, normalise). Runs as a Ray Data task map,
so decoding spreads over every CPU of the cluster and never occupies a model actor.

An image that cannot be read or decoded (truncated, corrupt, not an image) becomes a row
with ``error`` set and an empty input: the model stage passes it through and the driver
reports it; the other images of its batch go on.
"""

from __future__ import annotations

import io
from functools import lru_cache

import numpy as np
from PIL import Image, ImageOps

from vlp.contract.uri_files import read_bytes
from vlp.models.vision.extractors.base import ExtractSettings

EMPTY_INPUT = np.zeros((3, 1, 1), np.float32)


@lru_cache(maxsize=4)
def _preparer(model: str, settings: ExtractSettings):
    # preparation needs the extractor's resize/normalise rule, not its weights: a random one
    # built once per worker process
    from vlp.models.vision.extractors.registry import build_extractor
    return build_extractor(model, None, settings)


def decode_rgb(blob: bytes) -> np.ndarray:
    """Encoded bytes → HWC uint8 RGB, EXIF orientation applied. ``load()`` forces the whole
    file to be decoded here, so a truncated file fails here and not later."""
    with Image.open(io.BytesIO(blob)) as im:
        im.load()
        im = ImageOps.exif_transpose(im)
        return np.asarray(im.convert("RGB"), dtype=np.uint8)


class PrepareImages:
    """``map_batches`` function (a callable instance: Ray runs it as tasks) turning
    ``{image_id, location}`` rows into model inputs."""

    def __init__(self, model: str, settings: ExtractSettings):
        self.model, self.settings = model, settings

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, object]:
        extractor = _preparer(self.model, self.settings)
        inputs, scales, heights, widths, errors = [], [], [], [], []
        for loc in batch["location"]:
            try:
                rgb = decode_rgb(read_bytes(str(loc)))
                x, scale = extractor.prepare(rgb)
                h, w = rgb.shape[:2]
                error = ""
            except Exception as e:  # any unreadable image is that image's failure alone
                x, scale, h, w = EMPTY_INPUT, 0.0, 0, 0
                error = f"{type(e).__name__}: {' '.join(str(e).split())}"[:300]
            inputs.append(x)
            scales.append(scale)
            heights.append(h)
            widths.append(w)
            errors.append(error)
        return {"image_id": batch["image_id"], "location": batch["location"],
                "input": _ragged(inputs), "scale": np.asarray(scales, np.float64),
                "height": np.asarray(heights, np.int32), "width": np.asarray(widths, np.int32),
                "error": np.asarray(errors, dtype=object)}


def _ragged(arrays: list[np.ndarray]) -> np.ndarray:
    """An object array of per-image arrays (Ray stores it as a variable-shape tensor column)."""
    out = np.empty(len(arrays), dtype=object)
    for i, a in enumerate(arrays):  # (slice assignment would broadcast equal shapes)
        out[i] = a
    return out
