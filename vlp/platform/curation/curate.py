"""``curate_source``: run the curation filters over one source's pairs and write the result.

Input: a data folder (``manifest.json``) and a source name. Output, in ``OUT``:

- ``images/<name>/…``: the source's shards with the surviving pairs (cleaned captions), one
  output shard per input shard, built in a hidden staging folder and renamed into place;
  images that lose every caption leave, images that had none pass through (a task table may
  need their features);
- ``meta/curation/<name>.json``: the report (settings, pairs and images in and out, pairs
  removed per filter in order, the ITM model that scored them);
- ``meta/curation/<name>.removed.parquet``: every removed pair (image id, caption index,
  original caption, filter), to inspect what went and to measure curation against labels;
- the manifest entry of the source (and a line in ``meta/imports.jsonl``).
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from vlp.platform.curation.curation_config import CurationConfig
from vlp.platform.curation.pairs import PairTable, load_pairs
from vlp.platform.curation.registry import FILTERS, CurationContext, check_filter_names
from vlp.datasets.storage.shards import read_image_shard, write_image_shard
from vlp.contract.atomic_write import write_json_atomic
from vlp.datasets.storage.world import WorldError, load_manifest
from vlp.contract.atomic_write import atomic_path

REPORT_DIR = "meta/curation"


@dataclass
class CurationReport:
    source: str
    out_source: str
    out: str
    settings: dict
    filters: list[str]                      # the filters that ran, in order
    pairs_in: int = 0
    pairs_out: int = 0
    images_in: int = 0                      # captioned images
    images_out: int = 0
    uncaptioned_passed_through: int = 0
    removed: dict[str, int] = field(default_factory=dict)   # filter → pairs, in order
    itm: dict | None = None
    seconds: float = 0.0

    def to_json(self) -> dict:
        return asdict(self)


@dataclass
class CurationResult:
    report: CurationReport
    pairs: PairTable
    removed_by: np.ndarray                  # object [P]: "" kept, else the filter's name


def run_filters(pairs: PairTable, cfg: CurationConfig, ctx: CurationContext,
                names: list[str] | None = None) -> tuple[np.ndarray, list[str]]:
    """Apply the active filters (all, or ``names``) in registry order; each pair is charged
    to the first filter that removes it. Returns (removed_by, the filters that ran)."""
    wanted = set(check_filter_names(names) if names is not None else FILTERS)
    removed_by = np.full(pairs.num_pairs, "", dtype=object)
    ran = []
    for name, f in FILTERS.items():
        if name not in wanted or not f.active(cfg, ctx):
            continue
        alive = removed_by == ""
        gone = f(pairs, alive, cfg, ctx) & alive
        removed_by[gone] = name
        ran.append(name)
    return removed_by, ran


def curate_source(folder: str | os.PathLike, source: str, out: str | os.PathLike,
                  cfg: CurationConfig, *, out_source: str | None = None, scorer=None,
                  filters: list[str] | None = None, overwrite: bool = False,
                  itm_info: dict | None = None) -> CurationResult:
    from vlp.datasets.stream.text_tokenizer import load_tokenizer

    start = time.perf_counter()
    root, out = Path(folder), Path(out)
    world = load_manifest(root)
    if source not in world.sources:
        raise WorldError(f"{root}: no source {source!r}; it has {sorted(world.sources)}")
    info = world.sources[source]
    name = out_source or source
    target = out / "images" / name
    if target.exists() and not overwrite:
        raise FileExistsError(f"{target} already exists; pass --overwrite to replace it")
    if cfg.min_itm_score is not None and scorer is None:
        raise ValueError("min_itm_score needs a model to score pairs (--checkpoint)")

    files = [f for fs in info.files.values() for f in fs]
    pairs = load_pairs([root / f for f in files])
    ctx = CurationContext(tokenizer=load_tokenizer(None), scorer=scorer)
    removed_by, ran = run_filters(pairs, cfg, ctx, filters)
    kept = removed_by == ""
    report = CurationReport(source, name, str(out), cfg.to_dict(), ran,
                            pairs_in=pairs.num_pairs, pairs_out=int(kept.sum()),
                            images_in=pairs.num_images,
                            removed={n: int((removed_by == n).sum()) for n in ran},
                            itm=itm_info)
    if scorer is not None:
        s = pairs.itm_score[~np.isnan(pairs.itm_score)]
        report.itm = dict(itm_info or {}, scored_pairs=int(s.size),
                          mean_score=round(float(s.mean()), 4) if s.size else None)
    register = _write(root, files, info, world, pairs, kept, out, name, report, overwrite)
    _write_removed(out / REPORT_DIR / f"{name}.removed.parquet", pairs, removed_by)
    report.seconds = round(time.perf_counter() - start, 2)
    write_json_atomic(out / REPORT_DIR / f"{name}.json", report.to_json())
    register()   # the manifest, through which training finds the source, is written last
    return CurationResult(report, pairs, removed_by)


def _captions_by_file(pairs: PairTable, kept: np.ndarray) -> dict[int, dict[int, list]]:
    """file index → row → the kept (cleaned) captions, in their original order."""
    out: dict[int, dict[int, list[str]]] = {}
    for p in np.flatnonzero(kept):
        i = pairs.image[p]
        out.setdefault(int(pairs.image_file[i]), {}).setdefault(
            int(pairs.image_row[i]), []).append(pairs.text[p])
    return out


def _write(root, files, info, world, pairs, kept, out, name, report, overwrite):
    """Write the curated shards; return the function that lists them in OUT's manifest."""
    from vlp.datasets.importers.data_folder import (check_compatible, import_record, new_world,
                                                    staged_folder, update_world)
    from vlp.datasets.storage.world import SourceInfo

    out_world = None
    if (out / "manifest.json").is_file():
        out_world = load_manifest(out, check_files=False)
        check_compatible(out_world, name, feature_dim=world.feature_dim,
                         num_classes=world.num_classes,
                         feature_extractor=world.feature_extractor)
    split_of = {f: sp for sp, fs in info.files.items() for f in fs}
    src_dir = root / info.folder
    listed: dict[str, list[str]] = {}
    per_split: dict[str, int] = {}
    images = n_pairs = passed = 0
    by_file = _captions_by_file(pairs, kept)
    with staged_folder(out / "images" / name, overwrite) as stage:
        for k, rel in enumerate(files):
            table, shard = read_image_shard(root / rel, check_values=False)
            caps = by_file.get(k, {})
            uncaptioned = np.flatnonzero(~table.column("captions").is_valid().to_numpy(
                zero_copy_only=False))
            rows = sorted(set(caps) | set(uncaptioned.tolist()))
            if not rows:
                continue
            new = table.take(pa.array(rows, pa.int64()))
            new = new.set_column(new.column_names.index("captions"), "captions",
                                 pa.array([caps.get(r) for r in rows], pa.list_(pa.string())))
            local = (root / rel).relative_to(src_dir) if (root / rel).is_relative_to(
                src_dir) else Path((root / rel).name)
            write_image_shard(stage / local, new.replace_schema_metadata(None),
                              feature_extractor=shard.feature_extractor,
                              feature_dim=shard.feature_dim, num_classes=shard.num_classes,
                              extra_meta={**(shard.extra or {}), "curated_from": rel})
            listed.setdefault(split_of[rel], []).append(f"images/{name}/{local}")
            images += len(rows)
            passed += len(uncaptioned)
            n_pairs += sum(len(c) for c in caps.values())
            for sp in new.column("split").to_pylist():
                per_split[sp] = per_split.get(sp, 0) + 1
    report.images_out = images - passed
    report.uncaptioned_passed_through = passed

    def change(w) -> None:
        w.sources[name] = SourceInfo(f"images/{name}", info.domain, images, n_pairs,
                                     listed, dict(sorted(per_split.items())))

    def create():
        return new_world(out, feature_dim=world.feature_dim, num_classes=world.num_classes,
                         class_names=world.class_names,
                         feature_extractor=world.feature_extractor)
    def register() -> None:
        counts = {"pairs_in": report.pairs_in, "pairs_out": report.pairs_out,
                  **report.removed}
        update_world(out, change, create=create,
                     log=import_record("curate", [root / f for f in files], counts,
                                       dict(report.settings, source=report.source),
                                       sorted(f for fs in listed.values() for f in fs)))
    return register


def _write_removed(path: Path, pairs: PairTable, removed_by: np.ndarray) -> None:
    gone = np.flatnonzero(removed_by != "")
    table = pa.table({
        "image_id": pa.array([pairs.image_id[pairs.image[p]] for p in gone], pa.string()),
        "caption_index": pa.array(pairs.caption_index[gone], pa.int32()),
        "caption": pa.array([pairs.original[p] for p in gone], pa.string()),
        "filter": pa.array(removed_by[gone].tolist(), pa.string()),
        "itm_score": pa.array(pairs.itm_score[gone], pa.float32())})
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp)
