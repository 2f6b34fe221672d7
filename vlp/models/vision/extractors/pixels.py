"""``pixels``: the image itself, resized per the settings and encoded, for the end-to-end
families (SOHO reads the ``pixels`` column and runs its own CNN); no model.

The shard format still needs at least one region per row: the row gets one box covering the
whole image whose 3-d feature is the image's mean RGB in [0, 1] (what a reader that wants
regions from a pixels store would get from its one region), confidence 1.
"""

from __future__ import annotations

import io

import numpy as np
import torch
from PIL import Image

from vlp.models.vision.extractors.base import Extractor, ExtractSettings
from vlp.models.vision.extractors.image_prep import resize_rgb

JPEG_QUALITY = 95


class PixelsExtractor(Extractor):
    def __init__(self, settings: ExtractSettings):
        super().__init__()
        self.name, self.settings, self.weights_sha256 = "pixels", settings, None

    def prepare(self, rgb: np.ndarray) -> tuple[np.ndarray, float]:
        return resize_rgb(rgb, self.settings)

    @torch.no_grad()
    def extract(self, inputs: list[torch.Tensor], scales: list[float],
                sizes: list[tuple[int, int]]) -> list[dict[str, np.ndarray | None]]:
        out = []
        for x, (h, w) in zip(inputs, sizes):
            rgb = x.cpu().numpy()
            buf = io.BytesIO()
            Image.fromarray(rgb).save(buf, format="JPEG", quality=JPEG_QUALITY)
            mean = (rgb.reshape(-1, 3).mean(0) / 255.0).astype(np.float16)
            out.append({"boxes": np.asarray([[0, 0, w, h]], np.float32),
                        "confidences": np.ones(1, np.float32),
                        "features": mean[None, :], "soft_labels": None,
                        "image_feature": mean,
                        "pixels": np.frombuffer(buf.getvalue(), np.uint8)})
        return out

    def metadata(self) -> dict[str, str]:
        return {**super().metadata(), "pixels_encoding": f"jpeg q{JPEG_QUALITY}"}


def build_pixels(weights: str | None, settings: ExtractSettings, size: str = "base"
                 ) -> PixelsExtractor:
    if weights is not None:
        raise ValueError(f"--weights {weights}: the pixels extractor has no model; pass "
                         f"--weights random (or leave it out)")
    return PixelsExtractor(settings)
