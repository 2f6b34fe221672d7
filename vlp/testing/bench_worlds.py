"""The benchmarks' shared world cache: synthetic worlds generated once under
``~/.cache/vlp/bench-worlds`` and reused, and a copy of a world with wider features."""

from __future__ import annotations

import json
from pathlib import Path


def ensure_world(path: Path | None, scale: str) -> Path:
    if path is not None:
        return path
    from vlp.datasets.synth import generate_world
    path = Path.home() / ".cache" / "vlp" / "bench-worlds" / f"{scale}-seed0"
    if not (path / "manifest.json").is_file():
        print(f"# generating the {scale} world into {path}", flush=True)
        generate_world(path, scale=scale, seed=0, overwrite=True)
    return path


def widen_world(world: Path, dim: int) -> Path:
    """A copy of the world's pretraining shards with random ``dim``-wide fp16 features."""
    import numpy as np

    from vlp.datasets.storage.arrow_views import binary_array
    from vlp.datasets.storage.shards import read_image_shard, write_image_shard
    from vlp.datasets.storage.world import load_manifest
    out = world.parent / f"{world.name}-d{dim}"
    if (out / "manifest.json").is_file():
        return out
    print(f"# writing {dim}-d features into {out}", flush=True)
    m = load_manifest(world)
    rng = np.random.default_rng(0)
    for name in m.pretraining_sources():
        for f in m.image_files(name):
            table, info = read_image_shard(f, check_values=False)
            n = table.column("num_boxes").to_numpy().astype(np.int64)
            feats = rng.standard_normal(int(n.sum()) * dim, dtype=np.float32).astype("<f2")
            off = np.concatenate([[0], np.cumsum(n)]) * dim * 2
            table = table.set_column(table.schema.get_field_index("features"), "features",
                                     binary_array(off, feats.view(np.uint8)))
            write_image_shard(out / f.relative_to(world), table.replace_schema_metadata(None),
                              feature_extractor=f"random-d{dim}", feature_dim=dim,
                              num_classes=info.num_classes)
    manifest = m.to_json()
    manifest.update(feature_dim=dim, tasks={}, sources={
        k: v for k, v in manifest["sources"].items() if k in m.pretraining_sources()})
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return out
