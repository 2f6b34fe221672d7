"""Features of the annotated boxes of the downstream images: RefCOCO+'s ground-truth setting.

UNITER evaluates RE comprehension on two feature stores of the same images: the detector's
own boxes (``val^d``) and features extracted on the annotated objects' boxes (``val``; its
``re_coco_gt`` image database). The second is written as its own image source,
``downstream_gt``: the same image ids, one region per scene object in scene order (so region
k is ``gt_boxes[k]`` and ``target_gt_index`` indexes it), confidence 1, features from the
same simulated detector's second stage on exactly those boxes. No pixels: they would
duplicate the ``downstream`` source's.

They are a *sidecar* of the ``downstream`` source (``manifest.sidecars["gt_box_features"]``),
not a source of their own: the same images under the same ids, which the leakage audit
already checks through ``downstream``; a second pool of those ids would make every task
table's images ambiguous to it.
"""

from __future__ import annotations

import numpy as np

from vlp.datasets.storage.shards import image_table, write_image_shard
from vlp.datasets.synth.detector import NUM_CLASSES, SimulatedDetector
from vlp.datasets.synth.synthetic_image import SOURCE_CODES, stream
from vlp.datasets.synth.scene import Scene

GT_SIDECAR = "gt_box_features"          # manifest.sidecars key → folder of image shards
GT_FOLDER = "features/downstream_gt"
STREAM_GT_DETECTOR, STREAM_GT_FEATURES = 4, 5   # after images.py's streams 0-3


def write_gt_features(root, scenes: dict[str, list[Scene]], seed: int,
                      detector: SimulatedDetector, images_per_shard: int, shard_meta: dict,
                      of: str = "downstream") -> dict[str, list[str]]:
    """Write the shards; returns split → shard paths relative to ``root``."""
    files: dict[str, list[str]] = {}
    code = SOURCE_CODES[of]
    d = detector.cfg
    for split, split_scenes in scenes.items():
        files[split] = []
        for start in range(0, len(split_scenes), images_per_shard):
            chunk = split_scenes[start:start + images_per_shard]
            dets, rngs = [], []
            for s in chunk:
                index = int(s.image_id.rsplit("_", 1)[1])   # the image's stream index
                boxes = np.array([o.box for o in s.objects], np.float64)
                dets.append(detector.describe(s, boxes, ["object"] * len(boxes),
                                              stream(seed, code, index, STREAM_GT_DETECTOR),
                                              sort=False))
                rngs.append(stream(seed, code, index, STREAM_GT_FEATURES))
            detector.featurize(dets, rngs)
            rows = [{"image_id": s.image_id, "source": of, "split": split,
                     "width": s.canvas, "height": s.canvas, "boxes": det.boxes,
                     "confidences": np.ones(len(det.boxes), np.float32),
                     "features": det.features, "soft_labels": det.soft_labels,
                     "pixels": None, "captions": None}
                    for s, det in zip(chunk, dets)]
            rel = f"{GT_FOLDER}/{split}-{len(files[split]):05d}.parquet"
            write_image_shard(root / rel, image_table(rows, d.feature_dim, NUM_CLASSES),
                              feature_extractor=d.name, feature_dim=d.feature_dim,
                              num_classes=NUM_CLASSES,
                              extra_meta={**shard_meta, "domain": "downstream",
                                          "boxes": "ground truth"})
            files[split].append(rel)
    return files
