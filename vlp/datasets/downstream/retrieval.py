"""Image–text retrieval (Flickr30K-style: 5 captions per image).

Finetuning (UNITER): each training caption forms a group ``[positive, k image negatives,
k text negatives]``: the caption with other images, and the image with other images'
captions. With hard-negative mining the group carries ``candidates`` of each side instead
and ``hard_keep = k``: the model scores the candidates without gradients and trains on the
top k of each side (UNITER's on-the-fly variant of its sampled hard negatives).

In-batch groups (``in_batch``, SOHO §4.2.1): the t captions of the mini-batch are its t
aligned pairs; each caption's image forms a group with every caption of the batch, its own
first (t rows per group, t² in all), and ``match_labels`` says which rows match (a caption of
the same image drawn twice is a match, not a negative).

Evaluation scores every (text, image) pair of the split (or of its first ``max_images`` images
and their captions): :meth:`RetrievalData.pair_batch`.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import torch

from vlp.contract import downstream_keys as D
from vlp.datasets.downstream.base import TableData
from vlp.datasets.downstream.data_errors import DownstreamDataError
from vlp.datasets.downstream.text import text_batch


class RetrievalData(TableData):
    task = "retrieval"

    def __init__(self, cfg, split: str, negatives: int = 1, hard_candidates: int = 0,
                 max_images: int = 0, in_batch: bool = False):
        super().__init__(cfg, split)
        if max_images:
            self._keep_first_images(max_images)
        self.captions = self.texts("caption")
        ids = self.column("image_id")
        self.rows = self.image_rows("image_id")
        # the split's images in first-seen order: the gallery and the columns of the scores
        self.image_ids = list(dict.fromkeys(ids))
        self.gallery = self.images.rows(self.image_ids, table=self.path)
        column = {i: k for k, i in enumerate(self.image_ids)}
        self.text_to_image = np.array([column[i] for i in ids], np.int64)
        if len(self.image_ids) < 2:
            raise DownstreamDataError(f"{self.path}: retrieval needs at least 2 images")
        self.negatives = negatives
        self.hard_candidates = hard_candidates
        self.in_batch = in_batch
        if in_batch and hard_candidates:
            raise DownstreamDataError("retrieval: in-batch groups take no mined negatives "
                                      "(hard_candidates must be 0)")

    def _keep_first_images(self, n: int) -> None:
        """The split's first ``n`` images (first-seen order) and every caption of them: a
        smaller gallery, as COCO's 1K test is a part of its 5K one. R@K rises as the gallery
        shrinks, so scores are comparable only at the same ``n``."""
        ids = self.column("image_id")
        keep = set(list(dict.fromkeys(ids))[:n])
        self.table = self.table.filter(pa.array([i in keep for i in ids]))

    # ---- finetuning -----------------------------------------------------------------------

    def batch(self, idx: np.ndarray, rng: np.random.Generator | None = None
              ) -> dict[str, torch.Tensor]:
        """Groups of 1 + 2m rows (m = hard_candidates, else negatives) per caption in ``idx``."""
        rng = rng if rng is not None else np.random.default_rng(0)
        idx = np.asarray(idx, np.int64)
        if self.in_batch:
            return self.in_batch_groups(idx)
        m = self.hard_candidates or self.negatives
        own = self.text_to_image[idx]                                   # gallery columns
        neg_img = _others(own, len(self.image_ids), m, rng)             # [B, m] columns
        # captions of other images: draw an image ≠ own, then one of its captions
        neg_txt_img = _others(own, len(self.image_ids), m, rng)
        neg_txt = self._caption_of(neg_txt_img, rng)                    # [B, m] caption rows
        B, G = len(idx), 1 + 2 * m
        text_rows = np.concatenate([idx[:, None], np.repeat(idx[:, None], m, 1), neg_txt], 1)
        image_cols = np.concatenate([own[:, None], neg_img, np.repeat(own[:, None], m, 1)], 1)
        text = text_batch(self.tok, [(self.captions, text_rows.reshape(-1), 0)])
        visual = self.images.visual_arrays(self.gallery[image_cols.reshape(-1)])
        return self.assemble(text, visual, B, {
            D.GROUP_SIZE: G, D.IMAGE_NEGATIVES: m, D.TEXT_NEGATIVES: m,
            D.HARD_KEEP: self.negatives if self.hard_candidates else 0,
            D.EXAMPLE_INDEX: idx})

    def in_batch_groups(self, idx: np.ndarray) -> dict[str, torch.Tensor]:
        """One group per caption of ``idx``: its image with every caption of the batch, its
        own caption first, then the others in batch order."""
        t = len(idx)
        own = self.text_to_image[idx]
        order = np.array([[k] + [j for j in range(t) if j != k] for k in range(t)], np.int64)
        text_rows = idx[order]                                          # [t, t]
        image_cols = np.repeat(own[:, None], t, 1)
        match = (self.text_to_image[text_rows] == image_cols).astype(np.float32)
        text = text_batch(self.tok, [(self.captions, text_rows.reshape(-1), 0)])
        visual = self.images.visual_arrays(self.gallery[image_cols.reshape(-1)])
        return self.assemble(text, visual, t, {
            D.GROUP_SIZE: t, D.IMAGE_NEGATIVES: 0, D.TEXT_NEGATIVES: t - 1, D.HARD_KEEP: 0,
            D.MATCH_LABELS: match, D.EXAMPLE_INDEX: idx})

    def _caption_of(self, image_cols: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        if not hasattr(self, "_by_image"):
            order = np.argsort(self.text_to_image, kind="stable")
            counts = np.bincount(self.text_to_image, minlength=len(self.image_ids))
            self._by_image = (order, np.concatenate([[0], np.cumsum(counts)]))
        order, start = self._by_image
        n = start[image_cols + 1] - start[image_cols]
        pick = start[image_cols] + (rng.random(image_cols.shape) * n).astype(np.int64)
        return order[pick]

    # ---- evaluation -----------------------------------------------------------------------

    def pair_batch(self, text_idx: np.ndarray, image_cols: np.ndarray
                   ) -> dict[str, torch.Tensor]:
        """Rows (text_idx[j], image image_cols[j]) to score; no labels."""
        text_idx, image_cols = np.asarray(text_idx, np.int64), np.asarray(image_cols, np.int64)
        text = text_batch(self.tok, [(self.captions, text_idx, 0)])
        visual = self.images.visual_arrays(self.gallery[image_cols])
        return self.assemble(text, visual, len(text_idx), {})


def _others(own: np.ndarray, n: int, m: int, rng: np.random.Generator) -> np.ndarray:
    """[B, m] columns drawn uniformly among the n - 1 that differ from ``own``."""
    draw = rng.integers(0, n - 1, size=(len(own), m))
    return draw + (draw >= own[:, None])
