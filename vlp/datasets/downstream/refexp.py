"""RefCOCO+ comprehension: expression + image regions → which region is referred to.

Two settings (UNITER §4 / MAttNet): *detected* boxes — the image shard's detector regions,
the prediction is right when its box has IoU > 0.5 with the target box; *ground-truth* boxes
— features extracted on the annotated objects (the world's ``downstream_gt`` source), the
target is ``target_gt_index``. Training on detected boxes labels each expression with the
region of highest IoU with the target; expressions whose best region reaches IoU < 0.5 have
no right answer among the regions and are left out of training (counted in ``unlabelled``).
"""

from __future__ import annotations

import numpy as np
import torch

from vlp.contract import downstream_keys as D
from vlp.datasets.downstream.base import TableData
from vlp.datasets.downstream.data_errors import DownstreamDataError
from vlp.datasets.downstream.text import text_batch

SETTINGS = ("detected", "gt")
LABEL_IOU = 0.5


class RefExpData(TableData):
    task = "refexp"

    def __init__(self, cfg, split: str, boxes: str = "detected"):
        if boxes not in SETTINGS:
            raise DownstreamDataError(f"unknown RefCOCO+ box setting {boxes!r}; known: "
                                      f"{SETTINGS}")
        if cfg.visual != "regions":
            raise DownstreamDataError("RE comprehension scores image regions: it needs a "
                                      "region-input model family (not pixels)")
        super().__init__(cfg, split, gt=boxes == "gt")
        self.setting = boxes
        self.expressions = self.texts("expression")
        self.rows = self.image_rows("image_id")
        self.target_boxes = np.array(self.column("target_box"), np.float32).reshape(-1, 4)
        if boxes == "gt":
            self.labels = np.array(self.column("target_gt_index"), np.int64)
            n_gt = np.array([len(b) // 4 for b in self.column("gt_boxes")])
            have = self.images.num_regions(self.rows)
            bad = np.flatnonzero(have != n_gt)
            if len(bad):
                raise DownstreamDataError(
                    f"{self.path}: {len(bad)} expressions' images have a different number of "
                    f"ground-truth-box features than gt boxes (e.g. row {bad[0]}: "
                    f"{have[bad[0]]} vs {n_gt[bad[0]]}) in {self.images.files[0]}")
        else:
            self.labels = np.array([self._best_region(k) for k in range(len(self))], np.int64)
        self.labelled = np.flatnonzero(self.labels >= 0)
        self.unlabelled = len(self) - len(self.labelled)

    def _best_region(self, k: int) -> int:
        boxes = self.images.region_boxes(self.rows[k])
        iou = _iou(boxes, self.target_boxes[k])
        return int(iou.argmax()) if iou.max() >= LABEL_IOU else -1

    def region_boxes(self, k: int) -> np.ndarray:
        return self.images.region_boxes(self.rows[k])

    def batch(self, idx: np.ndarray, rng: np.random.Generator | None = None
              ) -> dict[str, torch.Tensor]:
        """``idx`` indexes the table; training callers pass rows of ``self.labelled``."""
        idx = np.asarray(idx, np.int64)
        text = text_batch(self.tok, [(self.expressions, idx, 0)])
        visual = self.images.visual_arrays(self.rows[idx])
        return self.assemble(text, visual, len(idx), {D.LABELS: self.labels[idx],
                                                      D.EXAMPLE_INDEX: idx})


def _iou(boxes: np.ndarray, target: np.ndarray) -> np.ndarray:
    """IoU of each of ``boxes`` [n, 4] with one ``target`` [4] (labels only; the metric is
    ``vlp.benchmarks.refcoco_plus.box_iou``)."""
    lt = np.maximum(boxes[:, :2], target[:2])
    rb = np.minimum(boxes[:, 2:], target[2:])
    inter = np.clip(rb - lt, 0, None).prod(1)
    area = lambda b: (np.clip(b[..., 2] - b[..., 0], 0, None)          # noqa: E731
                      * np.clip(b[..., 3] - b[..., 1], 0, None))
    return inter / np.maximum(area(boxes) + area(target) - inter, 1e-9)
