"""The GPU check's shards (jobs/benchmarks/bench_sources.py) have a real UNITER job's shapes —
BUTD's 10–100 regions per image, the requested feature width and class count, five captions
of 8–16 words — and pass the validating reader, so the check's figures describe rows of the
lengths a job meets (40–120 input units), not the synthetic world's 8–30."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "jobs" / "benchmarks"))

from bench_sources import write_bench_sources  # noqa: E402
from vlp.datasets.storage.shards import read_image_shard  # noqa: E402


def test_shards_have_a_real_jobs_shapes(tmp_path):
    folders = write_bench_sources(tmp_path, images=90, feature_dim=32, num_classes=11,
                                  per_shard=40)
    assert sorted(folders) == ["coco", "vg"]
    read = [read_image_shard(f) for folder in folders.values()
            for f in sorted(folder.glob("part-*.parquet"))]
    tables = [t for t, _ in read]
    assert all(info.feature_dim == 32 and info.num_classes == 11 for _, info in read)
    assert len(tables) == 2 + 1            # 60 coco images in shards of 40, 30 vg
    boxes = np.concatenate([t.column("num_boxes").to_numpy() for t in tables])
    assert len(boxes) == 90 and boxes.min() >= 10 and boxes.max() <= 100
    assert 25 <= np.median(boxes) <= 50   # most BUTD images: 20-50 regions
    for t in tables:
        row = t.slice(0, 1).to_pylist()[0]
        n = row["num_boxes"]
        assert len(row["features"]) == n * 32 * 2 and len(row["soft_labels"]) == n * 11 * 2
        assert len(row["captions"]) == 5
        assert all(8 <= len(c.split()) <= 16 for c in row["captions"])
