"""Image shards shaped like a real UNITER job's, for speed measurements (the GPU check,
``jobs/benchmarks/``) and the fixed shapes' padding test: BUTD-like region counts (10–100 per
image, UNITER's adaptive range), soft labels, COCO-length captions (5 per image, 8–16 common
words). The content is random: what a step costs depends on the shapes, not on what they hold.
The entry script is ``jobs/benchmarks/bench_sources.py`` (why not the synthetic world: there).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from vlp.datasets.storage.shards import image_table, write_image_shard

WORDS = tuple("""a an the man woman person people child boy girl dog cat horse bird cow sheep
elephant bear zebra giraffe car bus train truck boat plane bike motorcycle street road sidewalk
table chair couch bed window door wall floor kitchen room building house tree grass field
water beach snow sky cloud mountain hill plate bowl cup glass bottle food pizza sandwich cake
banana apple orange bread phone laptop computer book clock umbrella bag ball kite board frisbee
sitting standing walking riding holding eating playing looking lying flying parked next to on
in of with near under over behind front top side large small big little white black red blue
green yellow brown two three several some many group couple young old while his her their
its""".split())
FEATURE_EXTRACTOR = "bench-shapes-v1"


def region_counts(rng: np.random.Generator, n: int, low: int = 10, high: int = 100) -> np.ndarray:
    """Per-image region counts in [low, high], skewed low as BUTD's at confidence 0.2 are
    (most images 20–50 regions, a tail to 100)."""
    return np.clip(np.round(rng.lognormal(np.log(36), 0.45, n)), low, high).astype(int)


def captions(rng: np.random.Generator, k: int) -> list[str]:
    return [" ".join(rng.choice(WORDS, int(rng.integers(8, 17)))) for _ in range(k)]


def image_rows(rng: np.random.Generator, source: str, count: int, feature_dim: int,
               num_classes: int, start: int = 0):
    size = 600
    for i, n in enumerate(region_counts(rng, count)):
        xy = rng.uniform(0, size * 0.7, (n, 2))
        wh = rng.uniform(16, size * 0.3, (n, 2))
        feats = np.maximum(rng.standard_normal((n, feature_dim), np.float32), 0)
        logits = rng.standard_normal((n, num_classes), np.float32) * 3   # peaked, cheap
        soft = np.exp(logits - logits.max(1, keepdims=True))
        soft /= soft.sum(1, keepdims=True)
        yield {"image_id": f"{source}-{start + i:07d}", "source": source, "split": "train",
               "width": size, "height": size, "boxes": np.hstack([xy, xy + wh]),
               "confidences": rng.uniform(0.2, 1.0, n), "features": feats,
               "soft_labels": soft, "captions": captions(rng, 5)}


def write_bench_sources(out: str | Path, images: int = 3000, feature_dim: int = 2048,
                        num_classes: int = 1601, per_shard: int = 500, seed: int = 0
                        ) -> dict[str, Path]:
    """Write ``images`` images (2/3 "coco", 1/3 "vg") under ``out/images/<source>/``;
    returns source → folder."""
    rng = np.random.default_rng(seed)
    folders = {}
    for source, count in (("coco", images - images // 3), ("vg", images // 3)):
        folder = Path(out) / "images" / source
        folder.mkdir(parents=True, exist_ok=True)
        for k, start in enumerate(range(0, count, per_shard)):
            rows = list(image_rows(rng, source, min(per_shard, count - start), feature_dim,
                                   num_classes, start))
            write_image_shard(folder / f"part-{k:05d}.parquet",
                              image_table(rows, feature_dim, num_classes),
                              feature_extractor=FEATURE_EXTRACTOR, feature_dim=feature_dim,
                              num_classes=num_classes)
        folders[source] = folder
    return folders


__all__ = ["write_bench_sources", "region_counts", "FEATURE_EXTRACTOR"]
