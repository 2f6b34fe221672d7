"""Semantic filter (ImageBERT §3, "Image-Text Semantic Scoring": a weak image-text model
"to predict whether the <text, image> pair is semantically relevant or not ... to filter out
irrelevant pairs"): here the ITM head of a vlp model. Every pair still alive is scored (the
score also ranks one picture's texts in aggregation); with ``min_itm_score`` set, pairs below
it are removed."""

from __future__ import annotations

import numpy as np

from vlp.platform.curation.curation_config import CurationConfig
from vlp.platform.curation.pairs import PairTable


class ItmFilter:
    name = "itm"
    summary = "P(match) of the --checkpoint model's ITM head below --min-itm-score"

    def active(self, cfg: CurationConfig, ctx) -> bool:
        return ctx.scorer is not None

    def __call__(self, pairs: PairTable, alive: np.ndarray, cfg: CurationConfig, ctx
                 ) -> np.ndarray:
        idx = np.flatnonzero(alive)
        pairs.itm_score[idx] = ctx.scorer.score(pairs, idx)
        if cfg.min_itm_score is None:
            return np.zeros(pairs.num_pairs, bool)
        return alive & (pairs.itm_score < cfg.min_itm_score)
