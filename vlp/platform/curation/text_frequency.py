"""Aggregation, one text on many images (ImageBERT §3: "if too many images have the same
description, we will directly drop all these pairs"): boilerplate such as "click here to
read more" or "image may contain" is attached to whatever picture a template shows, so it
describes none of them. Texts are compared after lower-casing and trimming punctuation, and
images by content (the same picture under two ids counts once)."""

from __future__ import annotations

import re
from collections import defaultdict

import numpy as np

from vlp.platform.curation.curation_config import CurationConfig
from vlp.platform.curation.pairs import PairTable

_EDGE_PUNCT = re.compile(r"^[\W_]+|[\W_]+$")


def normalise_text(text: str) -> str:
    return _EDGE_PUNCT.sub("", " ".join(text.lower().split()))


class TextFrequencyFilter:
    name = "text_frequency"
    summary = "the same text on more than --max-images-per-text distinct images"

    def active(self, cfg: CurationConfig, ctx) -> bool:
        return cfg.max_images_per_text > 0

    def __call__(self, pairs: PairTable, alive: np.ndarray, cfg: CurationConfig, ctx
                 ) -> np.ndarray:
        images: dict[str, set[str]] = defaultdict(set)
        keys = {}
        for p in np.flatnonzero(alive):
            keys[p] = normalise_text(pairs.text[p])
            images[keys[p]].add(pairs.content[pairs.image[p]])
        bad = np.zeros(pairs.num_pairs, bool)
        for p, key in keys.items():
            bad[p] = len(images[key]) > cfg.max_images_per_text
        return bad
