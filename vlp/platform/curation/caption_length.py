"""Length filter (ImageBERT §3: "just keep sentences within a normal length"): a one-word
alt-text names a file or a product code more often than a picture, and very long text is a
paragraph of the page rather than a description of the image."""

from __future__ import annotations

import numpy as np

from vlp.platform.curation.curation_config import CurationConfig
from vlp.platform.curation.pairs import PairTable


class CaptionLengthFilter:
    name = "length"
    summary = "fewer than --min-words or more than --max-words whitespace words"

    def active(self, cfg: CurationConfig, ctx) -> bool:
        return cfg.min_words > 0 or cfg.max_words > 0

    def __call__(self, pairs: PairTable, alive: np.ndarray, cfg: CurationConfig, ctx
                 ) -> np.ndarray:
        bad = np.zeros(pairs.num_pairs, bool)
        for p in np.flatnonzero(alive):
            n = len(pairs.text[p].split())
            bad[p] = n < cfg.min_words or (cfg.max_words > 0 and n > cfg.max_words)
        return bad
