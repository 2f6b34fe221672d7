"""NLVR2: one statement about two images → true / false, in UNITER's three layouts.

- ``triplet``: one sequence ``[CLS] statement [SEP] regions(left) regions(right)``; the right
  image's regions carry their own token type (``image_types[1]``, a new row of the table).
- ``pair`` / ``pair-biattn``: two sequences per example, the statement with the left image and
  the statement with the right image, as consecutive rows (``group_size`` 2).
"""

from __future__ import annotations

import numpy as np
import torch

from vlp.contract import downstream_keys as D
from vlp.datasets.downstream.base import TableData, concat_visual
from vlp.datasets.downstream.data_errors import DownstreamDataError
from vlp.datasets.downstream.text import text_batch

VARIANTS = ("triplet", "pair", "pair-biattn")


class Nlvr2Data(TableData):
    task = "nlvr2"

    def __init__(self, cfg, split: str, variant: str = "pair-biattn",
                 image_types: tuple[int, int] = (1, 2)):
        if variant not in VARIANTS:
            raise DownstreamDataError(f"unknown NLVR2 variant {variant!r}; known: {VARIANTS}")
        if variant == "triplet" and cfg.visual != "regions":
            raise DownstreamDataError("the NLVR2 triplet layout needs region input (two "
                                      "images' regions in one sequence); use pair or "
                                      "pair-biattn with pixel input")
        super().__init__(cfg, split)
        self.variant, self.image_types = variant, image_types
        self.statements = self.texts("statement")
        self.left, self.right = self.image_rows("image_id_left", "image_id_right")
        self.labels = np.array(self.column("label"), np.int64)

    def batch(self, idx: np.ndarray, rng: np.random.Generator | None = None
              ) -> dict[str, torch.Tensor]:
        idx = np.asarray(idx, np.int64)
        labels = {D.LABELS: self.labels[idx], D.EXAMPLE_INDEX: idx}
        if self.variant == "triplet":
            text = text_batch(self.tok, [(self.statements, idx, 0)])
            visual = concat_visual([self.images.visual_arrays(self.left[idx]),
                                    self.images.visual_arrays(self.right[idx])],
                                   self.image_types)
            return self.assemble(text, visual, len(idx), labels)
        rows = np.repeat(idx, 2)                                  # left, right, left, right…
        images = np.stack([self.left[idx], self.right[idx]], 1).reshape(-1)
        text = text_batch(self.tok, [(self.statements, rows, 0)])
        visual = self.images.visual_arrays(images)
        return self.assemble(text, visual, len(idx), {**labels, D.GROUP_SIZE: 2})
