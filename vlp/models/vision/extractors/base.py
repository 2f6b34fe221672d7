"""What every registered extractor is: a torch module with a CPU ``prepare`` stage (one image
→ model input, run in Ray Data's CPU map) and a batched ``extract`` stage (run in the model's
actor pool), plus the settings and weights digest every shard records.

The two stages are split so that decoding and resizing (CPU-bound, parallel over Ray's CPU
workers) never stall the accelerator, as Ray's batch-inference guide lays a job out.
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch


@dataclass(frozen=True)
class ExtractSettings:
    """The knobs that change what a region store holds (recorded in every shard). Defaults
    are BUTD's: short side 600, long side ≤ 1000, confidence ≥ 0.2, per-class NMS 0.3,
    10–100 boxes (UNITER's conversion used these)."""
    min_boxes: int = 10
    max_boxes: int = 100
    conf_threshold: float = 0.2
    nms_threshold: float = 0.3
    short_side: int = 600
    long_side: int = 1000
    grid: int = 8

    def problems(self) -> list[str]:
        """One line per invalid field (empty when the settings are usable)."""
        out = []
        if self.min_boxes < 1:
            out.append(f"min_boxes={self.min_boxes}: expected ≥ 1 (a shard row needs a region)")
        if self.max_boxes < self.min_boxes:
            out.append(f"max_boxes={self.max_boxes}: expected ≥ min_boxes={self.min_boxes}")
        for name in ("conf_threshold", "nms_threshold"):
            v = getattr(self, name)
            if not 0.0 <= v <= 1.0:
                out.append(f"{name}={v}: expected a value in [0, 1]")
        if self.short_side < 1 or self.long_side < self.short_side:
            out.append(f"short_side={self.short_side}, long_side={self.long_side}: expected "
                       f"1 ≤ short_side ≤ long_side")
        if self.grid < 1:
            out.append(f"grid={self.grid}: expected ≥ 1")
        return out

    def to_dict(self) -> dict[str, int | float]:
        return dataclasses.asdict(self)


def resized_hw(h: int, w: int, settings: ExtractSettings) -> tuple[int, int, float]:
    """(h', w', scale): shorter side → ``short_side`` unless the longer side would pass
    ``long_side`` (Detectron's ResizeShortestEdge rule, the one BUTD used)."""
    scale = settings.short_side / min(h, w)
    if max(h, w) * scale > settings.long_side:
        scale = settings.long_side / max(h, w)
    return max(1, round(h * scale)), max(1, round(w * scale)), scale


def file_sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


class Extractor(torch.nn.Module):
    """What every registered extractor is.

    ``prepare`` is the CPU stage: HWC uint8 RGB (EXIF orientation already applied) → (HWC
    uint8 RGB resized per settings, scale = resized / original). It stays uint8: the image
    crosses Ray's object store once, at a quarter of a float32 copy's bytes, and the
    extractor normalises it on its own device.

    ``extract`` is the model stage: one dict per image, inputs (the prepared uint8 images,
    any mix of sizes) already on the model's device, ``sizes`` the original (h, w) of each
    image. A batch's results equal those of its images run one at a time:

    - ``boxes`` (N, 4) float32 x1, y1, x2, y2 in ORIGINAL image pixels, inside the image;
    - ``confidences`` (N,) float32;
    - ``features`` (N, D) float16, finite;
    - ``soft_labels`` (N, C) float32 rows summing to 1, or None;
    - ``image_feature`` (D,) float16 (one RoI covering the whole image) or None.

    An extractor with ``takes_boxes`` also takes ``boxes=``: per image, (N, 4) float32 boxes
    in original pixels that become its regions, in that order and count, instead of its own
    (``vlp data extract --boxes``); the others have no boxes to take (grid cells, pixels).
    """

    takes_boxes: bool = False
    name: str
    settings: ExtractSettings
    weights_sha256: str | None

    def prepare(self, rgb: np.ndarray) -> tuple[np.ndarray, float]:
        raise NotImplementedError

    @torch.no_grad()
    def extract(self, inputs: list[torch.Tensor], scales: list[float],
                sizes: list[tuple[int, int]]) -> list[dict[str, np.ndarray | None]]:
        raise NotImplementedError

    def metadata(self) -> dict[str, str]:
        """What every shard records: extractor name, settings, weights sha256, image sizes."""
        s = self.settings
        return {"extractor": self.name,
                "extract_settings": ",".join(f"{k}={v}" for k, v in s.to_dict().items()),
                "weights_sha256": self.weights_sha256 or "random-init",
                "image_sizes": f"short_side={s.short_side},long_side={s.long_side}"}
