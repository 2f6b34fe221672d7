"""Image filter (ImageBERT §3: "only keep images whose width and height are both larger than
300 pixels"): a floor on the shorter side and a ceiling on the aspect ratio, which removes
the banners, strips and icons that web pages carry next to their real pictures."""

from __future__ import annotations

import numpy as np

from vlp.platform.curation.curation_config import CurationConfig
from vlp.platform.curation.pairs import PairTable


class ImageSizeFilter:
    name = "image_size"
    summary = "shorter side below --min-side, or longer/shorter side above --max-aspect-ratio"

    def active(self, cfg: CurationConfig, ctx) -> bool:
        return cfg.min_side > 0 or cfg.max_aspect_ratio > 0

    def __call__(self, pairs: PairTable, alive: np.ndarray, cfg: CurationConfig, ctx
                 ) -> np.ndarray:
        w = pairs.width[pairs.image].astype(np.float64)
        h = pairs.height[pairs.image].astype(np.float64)
        short, long = np.minimum(w, h), np.maximum(w, h)
        bad = np.zeros(pairs.num_pairs, bool)
        if cfg.min_side:
            bad |= short < cfg.min_side
        if cfg.max_aspect_ratio:
            bad |= long > cfg.max_aspect_ratio * short
        return bad & alive
