"""RefCOCO+ comprehension: expression + image regions → which region is referred to.

Two settings (UNITER §4 / MAttNet): *detected* boxes — the image shard's detector regions,
the prediction is right when its box has IoU > 0.5 with the target box; *ground-truth* boxes
— features extracted on the annotated objects (the world's ``downstream_gt`` source), the
target is ``target_gt_index``. Training on detected boxes labels each expression with the
region of highest IoU with the target; expressions whose best region reaches IoU < 0.5 have
no right answer among the regions and are left out of training (counted in ``unlabelled``).

Which detected boxes (``detections``): ``shard-regions``, the image source's own detector
regions (selected as the family's pretraining selects them), or ``mattnet``, MAttNet's
detections (the boxes the papers' val^d ranks), imported with ``vlp data import mattnet-dets``:
every region of the image source is kept, and each image's regions must be that image's
MAttNet boxes (same count, each box matched at IoU ≥ 0.99), or the data refuses to load.
"""

from __future__ import annotations

import numpy as np
import torch

from vlp.contract import downstream_keys as D
from vlp.datasets.downstream.base import TableData
from vlp.datasets.downstream.data_errors import DownstreamDataError
from vlp.datasets.downstream.text import text_batch
from vlp.datasets.storage.world import WorldError, load_manifest
from vlp.datasets.stream.data_config import RegionConfig

SETTINGS = ("detected", "gt")
DETECTIONS = ("shard-regions", "mattnet")
LABEL_IOU = 0.5
SAME_BOX_IOU = 0.99          # a shard region is a MAttNet box (float32 pixels, rounded)
# the MAttNet setting scores every region the image source holds, in its order
EVERY_REGION = RegionConfig(conf_threshold=0.0, min_regions=1, max_regions=100)
MATTNET_DATASET = "refcoco+"


class RefExpData(TableData):
    task = "refexp"

    def __init__(self, cfg, split: str, boxes: str = "detected",
                 detections: str = "shard-regions"):
        if boxes not in SETTINGS:
            raise DownstreamDataError(f"unknown RefCOCO+ box setting {boxes!r}; known: "
                                      f"{SETTINGS}")
        if detections not in DETECTIONS:
            raise DownstreamDataError(f"unknown RefCOCO+ detections {detections!r}; known: "
                                      f"{DETECTIONS}")
        if cfg.visual != "regions":
            raise DownstreamDataError("RE comprehension scores image regions: it needs a "
                                      "region-input model family (not pixels)")
        mattnet = boxes == "detected" and detections == "mattnet"
        if mattnet:
            cfg = cfg.model_copy(update={"regions": EVERY_REGION})
        super().__init__(cfg, split, gt=boxes == "gt")
        self.setting = boxes
        # what the figure rests on: gt, mattnet or shard-regions (every output says which)
        self.boxes_label = "gt" if boxes == "gt" else detections
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
        if mattnet:
            check_mattnet_regions(self, mattnet_boxes(cfg.world, MATTNET_DATASET))
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


def mattnet_boxes(world: str, dataset: str) -> dict[str, np.ndarray]:
    """image id → MAttNet's boxes [n, 4] (x1, y1, x2, y2 pixels) from the world's import."""
    import pyarrow.parquet as pq

    from vlp.contract.uri_files import open_input
    from vlp.datasets.importers.mattnet_dets import SIDECAR

    try:
        manifest = load_manifest(world)
    except WorldError as e:
        raise DownstreamDataError(str(e)) from None
    rel = manifest.sidecars.get(SIDECAR.format(dataset=dataset))
    if rel is None:
        raise DownstreamDataError(
            f"{world}: detections mattnet, but the world has no MAttNet detections for "
            f"{dataset} (import them: vlp data import mattnet-dets "
            f"res101_coco_minus_refer_notime_dets.json --dataset {dataset} --out {world}); "
            f"or score the shard's own regions: detections shard-regions")
    path = manifest.path(rel)
    table = pq.read_table(open_input(str(path)), columns=["image_id", "boxes"])
    return {i: np.asarray(b, np.float32).reshape(-1, 4) for i, b in
            zip(table.column("image_id").to_pylist(), table.column("boxes").to_pylist())}


def check_mattnet_regions(data: "RefExpData", dets: dict[str, np.ndarray]) -> None:
    """Every image of the table: its regions are its MAttNet boxes, or one line naming the
    first image that differs and how many do."""
    ids = data.column("image_id")
    bad, first = 0, ""
    for image_id, row in dict(zip(ids, data.rows)).items():
        want = dets.get(image_id)
        have = data.images.region_boxes(int(row))
        if want is None:
            problem = "has no MAttNet detections"
        elif len(want) != len(have):
            problem = f"has {len(have)} regions, MAttNet {len(want)} boxes"
        else:
            best = np.array([_iou(have, w).max() for w in want])
            problem = "" if (best >= SAME_BOX_IOU).all() else (
                f"MAttNet box {int(np.argmin(best))} matches no region (best IoU "
                f"{best.min():.2f})")
        if problem:
            bad += 1
            first = first or f"image {image_id!r} {problem}"
    if bad:
        raise DownstreamDataError(
            f"{data.path}: detections mattnet, but {bad} of {len(set(ids))} images' regions "
            f"are not their MAttNet boxes (e.g. {first}) in {data.images.files[0]}: the "
            f"downstream image source must hold features extracted on MAttNet's boxes")


def _iou(boxes: np.ndarray, target: np.ndarray) -> np.ndarray:
    """IoU of each of ``boxes`` [n, 4] with one ``target`` [4] (labels only; the metric is
    ``vlp.benchmarks.refcoco_plus.box_iou``)."""
    lt = np.maximum(boxes[:, :2], target[:2])
    rb = np.minimum(boxes[:, 2:], target[2:])
    inter = np.clip(rb - lt, 0, None).prod(1)
    area = lambda b: (np.clip(b[..., 2] - b[..., 0], 0, None)          # noqa: E731
                      * np.clip(b[..., 3] - b[..., 1], 0, None))
    return inter / np.maximum(area(boxes) + area(target) - inter, 1e-9)
