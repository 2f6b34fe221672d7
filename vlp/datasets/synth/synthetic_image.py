"""One synthetic image end to end: scene → pixels → detector output → shard row + record.

Each image draws from its own random streams keyed by (seed, source, index, purpose), so an
image is the same whatever else is generated, and changing the caption code never changes a
feature.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vlp.datasets.synth.captions import Caption
from vlp.datasets.synth.detector import Detection, SimulatedDetector
from vlp.datasets.synth.render import encode_png, render_scene
from vlp.datasets.synth.scene import DomainStyle, Scene, sample_scene

SOURCE_CODES = {"coco": 1, "vg": 2, "cc": 3, "sbu": 4, "downstream": 5}
STREAM_SCENE, STREAM_TEXT, STREAM_DETECTOR, STREAM_FEATURES = 0, 1, 2, 3
# the whole-image RoI's own streams (after gt_features.py's 4, 5): adding it changed no
# region's draws
STREAM_WHOLE_DETECTOR, STREAM_WHOLE_FEATURES = 6, 7


def stream(seed: int, *key: int) -> np.random.Generator:
    return np.random.default_rng([seed, *key])


@dataclass
class SynthImage:
    scene: Scene
    detection: Detection
    pixels: bytes | None
    captions: list[Caption] | None
    feature_rng: np.random.Generator   # noise of the features, drawn when they are computed
    whole: Detection | None = None     # the detector's second stage on the whole-image box
    whole_rng: np.random.Generator | None = None

    def row(self, source: str, split: str) -> dict:
        d = self.detection
        assert d.features is not None, "call add_features() first"
        return {"image_id": self.scene.image_id, "source": source, "split": split,
                "width": self.scene.canvas, "height": self.scene.canvas, "boxes": d.boxes,
                "confidences": d.confidences, "features": d.features,
                "soft_labels": d.soft_labels, "pixels": self.pixels,
                "captions": None if self.captions is None else [c.text for c in self.captions],
                "image_feature": None if self.whole is None else self.whole.features[0]}

    def record(self, split: str) -> dict:
        """Ground truth for probes and curation: objects, and what each region covers."""
        return {"image_id": self.scene.image_id, "split": split,
                "objects": [o.record() for o in self.scene.objects],
                "regions": [{"object": int(o), "kind": k}
                            for o, k in zip(self.detection.objects, self.detection.kinds)]}


def make_image(seed: int, source: str, index: int, canvas: int, style: DomainStyle,
               detector: SimulatedDetector, captioner=None, pixels: bool = True) -> SynthImage:
    code = SOURCE_CODES[source]
    scene = sample_scene(stream(seed, code, index, STREAM_SCENE), f"{source}_{index:06d}",
                         canvas, style)
    detection = detector.detect(scene, stream(seed, code, index, STREAM_DETECTOR))
    png = encode_png(render_scene(scene)) if pixels else None
    captions = None
    if captioner is not None:
        captions = captioner(scene, stream(seed, code, index, STREAM_TEXT))
    # VL-BERT's text-side visual input: Fast R-CNN's second stage on a box covering the image
    whole = detector.describe(scene, np.array([[0.0, 0.0, canvas, canvas]]), ["whole"],
                              stream(seed, code, index, STREAM_WHOLE_DETECTOR), sort=False)
    return SynthImage(scene, detection, png, captions,
                      stream(seed, code, index, STREAM_FEATURES), whole,
                      stream(seed, code, index, STREAM_WHOLE_FEATURES))


def add_features(images: list[SynthImage], detector: SimulatedDetector) -> None:
    detector.featurize([i.detection for i in images], [i.feature_rng for i in images])
    # a call of its own: the regions' product keeps its shape, so their features are the
    # bytes they were before the whole-image RoI existed
    wholes = [i for i in images if i.whole is not None]
    detector.featurize([i.whole for i in wholes], [i.whole_rng for i in wholes])
