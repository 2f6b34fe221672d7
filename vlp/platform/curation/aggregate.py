"""Aggregation, one picture with many texts (ImageBERT §3: "one image is downloaded from
multiple web-pages and thus has different text descriptions. In this case we only select the
best scored <text, image> pair"). A picture is its content (the hash of its feature bytes),
so copies of it under several ids are one picture: the best texts are kept on the rows they
came from, and a copy left without texts leaves the corpus. "Best" is the ITM score when a
model scored the pairs, else the caption's in-vocabulary share; ties keep the first."""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from vlp.platform.curation.curation_config import CurationConfig
from vlp.platform.curation.pairs import PairTable


class BestTextsPerImage:
    name = "aggregate"
    summary = "beyond the --max-texts-per-image best scored texts of one picture"

    def active(self, cfg: CurationConfig, ctx) -> bool:
        return cfg.max_texts_per_image > 0

    def __call__(self, pairs: PairTable, alive: np.ndarray, cfg: CurationConfig, ctx
                 ) -> np.ndarray:
        groups: dict[str, list[int]] = defaultdict(list)
        for p in np.flatnonzero(alive):
            groups[pairs.content[pairs.image[p]]].append(int(p))
        score = pairs.score()
        bad = np.zeros(pairs.num_pairs, bool)
        for members in groups.values():
            if len(members) > cfg.max_texts_per_image:
                ranked = sorted(members, key=lambda p: (-score[p], p))   # stable: first wins
                bad[ranked[cfg.max_texts_per_image:]] = True
        return bad
