"""The CPU stage of the job: read an image's bytes, decode, apply its EXIF orientation
(image_files.py), and let the extractor resize it. Runs as a Ray Data task map, so decoding
spreads over every CPU of the cluster and never occupies a model actor.

What goes on to the model actors is the resized image as HWC uint8, normalised on the
model's device: at BUTD's 600×1000, 1.8 MB an image through the object store, where a
float32 CHW copy was 7.2 MB.

An image that cannot be read or decoded becomes a row with ``error`` set (what is wrong with
the file, one line) and an empty input: the model stage passes it through and the report
lists it; the other images of its batch go on.

With given boxes (``--boxes``) each row carries its image's boxes (``given_boxes``), passed
on to the model stage; a box that does not fit the decoded image makes that image's error
(naming the box), here, where the image's size is first known.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from vlp.models.vision.extractors.base import ExtractSettings
from vlp.platform.extract.given_boxes import box_outside, decoded
from vlp.platform.extract.image_files import BadImage, decode_rgb, read_image

EMPTY_INPUT = np.zeros((1, 1, 3), np.uint8)

__all__ = ["PrepareImages", "decode_rgb", "EMPTY_INPUT"]


@lru_cache(maxsize=4)
def _preparer(model: str, settings: ExtractSettings):
    # preparation needs the extractor's resize rule, not its weights: a random one built once
    # per worker process
    from vlp.models.vision.extractors.registry import build_extractor
    return build_extractor(model, None, settings)


class PrepareImages:
    """``map_batches`` function (a callable instance: Ray runs it as tasks) turning
    ``{image_id, location}`` rows into model inputs."""

    def __init__(self, model: str, settings: ExtractSettings):
        self.model, self.settings = model, settings

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, object]:
        extractor = _preparer(self.model, self.settings)
        given = batch.get("given_boxes")
        inputs, scales, heights, widths, errors = [], [], [], [], []
        for i, loc in enumerate(batch["location"]):
            try:
                rgb = read_image(str(loc))
                h, w = rgb.shape[:2]
                outside = None if given is None else box_outside(decoded(given[i]), w, h)
                if outside:     # the image's own fault: not worth its model time
                    raise BadImage(outside)
                x, scale = extractor.prepare(rgb)
                error = ""
            except BadImage as e:
                x, scale, h, w, error = EMPTY_INPUT, 0.0, 0, 0, str(e)
            except Exception as e:  # anything else is still that image's failure alone
                x, scale, h, w = EMPTY_INPUT, 0.0, 0, 0
                error = f"{type(e).__name__}: {' '.join(str(e).split())}"[:300]
            inputs.append(x)
            scales.append(scale)
            heights.append(h)
            widths.append(w)
            errors.append(error)
        out = {"image_id": batch["image_id"], "location": batch["location"],
               "input": _ragged(inputs), "scale": np.asarray(scales, np.float64),
               "height": np.asarray(heights, np.int32), "width": np.asarray(widths, np.int32),
               "error": np.asarray(errors, dtype=object)}
        if given is not None:
            out["given_boxes"] = given
        return out


def _ragged(arrays: list[np.ndarray]) -> np.ndarray:
    """An object array of per-image arrays (Ray stores it as a variable-shape tensor column)."""
    out = np.empty(len(arrays), dtype=object)
    for i, a in enumerate(arrays):  # (slice assignment would broadcast equal shapes)
        out[i] = a
    return out
