"""Region selection (UNITER): which detector boxes of an image become input regions.

Vectorised over a block of images: confidences arrive flat (all images' boxes one after the
other) with a per-image box count, as Arrow stores them. The kept boxes of each image are
ordered by confidence, highest first (BUTD's stored order), so "the top k" and "above the
threshold, clipped to [min, max]" are the same cut.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vlp.datasets.stream.data_config import RegionConfig


@dataclass(frozen=True)
class RegionSelection:
    keep: np.ndarray       # int64 [K]: indices into the flat box arrays, image by image
    counts: np.ndarray     # int32 [I]: regions kept per image
    fallback: np.ndarray   # bool [I]: no box above the threshold, the top-min kept instead


def select_regions(conf: np.ndarray, num_boxes: np.ndarray, cfg: RegionConfig
                   ) -> RegionSelection:
    num_boxes = np.asarray(num_boxes, dtype=np.int64)
    owner = np.repeat(np.arange(len(num_boxes)), num_boxes)
    start = np.concatenate([[0], np.cumsum(num_boxes)[:-1]]).astype(np.int64)
    above = np.bincount(owner, weights=conf > cfg.conf_threshold,
                        minlength=len(num_boxes)).astype(np.int64)
    if cfg.fixed_regions is not None:
        want = np.full(len(num_boxes), cfg.fixed_regions, dtype=np.int64)
        fallback = np.zeros(len(num_boxes), dtype=bool)
    else:
        want = np.clip(above, cfg.min_regions, cfg.max_regions)
        fallback = above == 0
    counts = np.minimum(want, num_boxes)
    # sort boxes by (image, confidence descending); lexsort is stable, so ties keep file order
    order = np.lexsort((-conf, owner))
    rank = np.arange(len(order)) - start[owner[order]]
    keep = order[rank < counts[owner[order]]]
    return RegionSelection(keep.astype(np.int64), counts.astype(np.int32), fallback)
