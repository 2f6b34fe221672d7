"""Writing one image source of the world: its shards (one split at a time, a fixed number of
images per shard), its ground-truth scene records, and the list of its unrelated captions."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from vlp.datasets.storage.shards import image_table, write_image_shard
from vlp.datasets.synth.detector import NUM_CLASSES, SimulatedDetector
from vlp.datasets.synth.synthetic_image import SynthImage, add_features, make_image
from vlp.datasets.synth.scales import ScaleConfig
from vlp.datasets.synth.scene import DomainStyle, Scene
from vlp.datasets.storage.world import SourceInfo


@dataclass
class DetectorTally:
    """The simulated detector's top-1 accuracy on regions that cover one object."""
    object_regions: int = 0
    correct: int = 0
    regions: int = 0
    images: int = 0

    def add(self, img: SynthImage) -> None:
        d = img.detection
        owned = d.objects >= 0
        truth = np.array([img.scene.objects[o].cls + 1 for o in d.objects[owned]], np.int64)
        self.object_regions += int(owned.sum())
        self.correct += int((d.soft_labels[owned, 1:].argmax(1) + 1 == truth).sum())
        self.regions += len(d.boxes)
        self.images += 1

    def summary(self) -> dict[str, float]:
        return {"detector_top1": round(self.correct / max(self.object_regions, 1), 4),
                "regions_per_image": round(self.regions / max(self.images, 1), 3)}


@dataclass
class SourceWriter:
    root: Path
    scale: ScaleConfig
    seed: int
    detector: SimulatedDetector
    shard_meta: dict
    on_image: Callable[[], None] = lambda: None      # progress
    tally: DetectorTally = field(default_factory=DetectorTally)
    unrelated: list[dict] = field(default_factory=list)

    def write(self, name: str, domain: str, style: DomainStyle, captioner,
              splits: dict[str, int]) -> tuple[SourceInfo, dict[str, list[Scene]]]:
        """Generate and write the source; returns its manifest entry and its scenes by split."""
        info = SourceInfo(f"images/{name}", domain, 0, 0, {}, {})
        scenes: dict[str, list[Scene]] = {}
        index = 0   # image index runs across splits so that ids are unique in the source
        (self.root / "scenes").mkdir(exist_ok=True)
        with open(self.root / "scenes" / f"{name}.jsonl", "w") as records:
            for split, count in splits.items():
                pending: list[SynthImage] = []
                info.files[split], scenes[split] = [], []
                for _ in range(count):
                    img = make_image(self.seed, name, index, self.scale.image_size, style,
                                     self.detector, captioner, self.scale.pixels)
                    index += 1
                    records.write(json.dumps(img.record(split), sort_keys=True) + "\n")
                    self._account(name, img, info)
                    scenes[split].append(img.scene)
                    pending.append(img)
                    if len(pending) == self.scale.images_per_shard:
                        info.files[split].append(self._flush(info, name, split, pending))
                        pending = []
                if pending:
                    info.files[split].append(self._flush(info, name, split, pending))
                info.splits[split] = count
                info.images += count
        return info, scenes

    def _account(self, name: str, img: SynthImage, info: SourceInfo) -> None:
        self.tally.add(img)
        for j, c in enumerate(img.captions or []):
            if c.unrelated:
                self.unrelated.append({"source": name, "image_id": img.scene.image_id,
                                       "caption_index": j, "reason": c.unrelated})
        info.pairs += len(img.captions or [])
        self.on_image()

    def _flush(self, info: SourceInfo, name: str, split: str, images: list[SynthImage]
               ) -> str:
        add_features(images, self.detector)
        d = self.detector.cfg
        rel = f"{info.folder}/{split}-{len(info.files[split]):05d}.parquet"  # as importers do
        write_image_shard(self.root / rel,
                          image_table([i.row(name, split) for i in images], d.feature_dim,
                                      NUM_CLASSES),
                          feature_extractor=d.name, feature_dim=d.feature_dim,
                          num_classes=NUM_CLASSES,
                          extra_meta={**self.shard_meta, "domain": info.domain})
        return rel
