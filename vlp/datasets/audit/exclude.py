"""UNITER's rule (Appendix A.1) applied: a copy of a data folder whose pretraining sources
hold no image of any downstream evaluation split.

The audit finds the pretraining rows that are evaluation images (by id, feature hash and
pixel hash); this writes a new folder in which the shards holding such rows are rewritten,
and everything else (other shards, task tables, sidecars) is hard-linked from the original
(copied where the file system cannot link). A leaking row is

- *uncaptioned* when a task table names it: COCO is a pretraining corpus and the image pool
  of VQA and RefCOCO at once, and the evaluation tables still need its features; pretraining
  reads image–caption pairs, so an image without captions is never pretrained on (the audit
  agrees: a table's image without captions is no pretraining leak);
- *removed* otherwise (a copy of an evaluation image under another id or in a web corpus).

The pipeline then reads the new folder like any other: no exclusion list to honour, no hook
in the data path.

The folder is built in a hidden staging folder next to the target and renamed into place when
complete (``OUT`` may be the audited folder itself: it is replaced in one rename), and its
``meta/leak_exclusion.json`` lists every removed image with the evaluation splits it belongs
to, per source.
"""

from __future__ import annotations

import os
import shutil
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from vlp.datasets.audit.leakage import PRETRAINING, AuditReport
from vlp.datasets.importers.data_folder import staged_folder
from vlp.datasets.storage.shards import read_image_shard, write_image_shard
from vlp.contract.atomic_write import write_json_atomic
from vlp.datasets.storage.world import MANIFEST_NAME

EXCLUSION_FILE = "meta/leak_exclusion.json"


@dataclass
class ExclusionReport:
    out: str
    removed: dict[str, list[dict]] = field(default_factory=dict)   # source → excluded images
    counts: dict[str, dict[str, int]] = field(default_factory=dict)
    files_rewritten: list[str] = field(default_factory=list)
    files_dropped: list[str] = field(default_factory=list)         # every row was a leak

    def to_json(self) -> dict:
        return asdict(self)


def _mirror(src: Path, dst: Path, skip: set[str]) -> None:
    """Hard-link every visible file of ``src`` into ``dst`` (copy across file systems)."""
    for dirpath, dirnames, filenames in os.walk(src):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]   # staging folders
        rel_dir = Path(dirpath).relative_to(src)
        for name in filenames:
            rel = rel_dir / name
            if name.startswith(".") or str(rel) in skip:
                continue
            target = dst / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(Path(dirpath) / name, target)
            except OSError:
                shutil.copy2(Path(dirpath) / name, target)


def exclude_leaks(folder: str | os.PathLike, report: AuditReport, out: str | os.PathLike, *,
                  overwrite: bool = False) -> ExclusionReport:
    """Write ``out``: ``folder`` without the pretraining rows ``report`` found to be
    evaluation images. ``report`` must be the audit of ``folder``."""
    root, out = Path(folder).resolve(), Path(out).resolve()
    if Path(report.root).resolve() != root:
        raise ValueError(f"the audit report is of {report.root}, not of {root}")
    if out != root and root in out.parents:
        raise ValueError(f"--out {out} lies inside the audited folder {root}: choose a "
                         f"folder beside it (or the folder itself, with --overwrite)")
    drop: dict[str, set[str]] = defaultdict(set)       # shard → image ids to exclude
    uncaption: set[tuple[str, str]] = set()            # (shard, id) a task table names
    source_of: dict[str, str] = {}
    leaks_of: dict[tuple[str, str], list] = defaultdict(list)
    for leak in report.leaks_of(PRETRAINING):
        drop[leak.file].add(leak.found_id)
        if leak.found_in_tasks:
            uncaption.add((leak.file, leak.found_id))
        source_of[leak.file] = leak.found_source
        leaks_of[(leak.found_source, leak.found_id)].append(leak)

    result = ExclusionReport(str(out))
    manifest = root / MANIFEST_NAME
    with staged_folder(out, overwrite=overwrite or out == root) as stage:
        _mirror(root, stage, skip={MANIFEST_NAME})
        removed_rows: dict[str, list[dict]] = defaultdict(list)   # source → rows removed
        for rel in sorted(drop):
            table, info = read_image_shard(root / rel)
            ids = table.column("image_id").to_pylist()
            hit = np.array([i in drop[rel] for i in ids])
            strip = np.array([(rel, i) in uncaption for i in ids]) & hit
            for k in np.flatnonzero(hit):
                removed_rows[source_of[rel]].append({
                    "image_id": ids[k], "split": table.column("split")[k].as_py(),
                    "captions": table.column("captions")[k].as_py(), "file": rel,
                    "action": "uncaptioned" if strip[k] else "removed"})
            caps = table.column("captions")
            kept = table.set_column(
                table.column_names.index("captions"), "captions",
                pc.if_else(pa.array(strip), pa.nulls(table.num_rows, caps.type), caps)
            ).filter(pa.array(~hit | strip))
            os.unlink(stage / rel)        # a hard link to the original: never write through
            if kept.num_rows == 0:
                result.files_dropped.append(rel)
                continue
            write_image_shard(stage / rel, kept.replace_schema_metadata(None),
                              feature_extractor=info.feature_extractor,
                              feature_dim=info.feature_dim, num_classes=info.num_classes,
                              extra_meta={**(info.extra or {}),
                                          "excluded_evaluation_images": len(drop[rel])})
            result.files_rewritten.append(rel)
        for source, rows in sorted(removed_rows.items()):
            result.removed[source] = [
                {"image_id": r["image_id"], "split": r["split"], "file": r["file"],
                 "action": r["action"], "pairs": len(r["captions"] or []),
                 "evaluated_in": sorted({w for l in leaks_of[(source, r["image_id"])]
                                         for w in l.evaluated_in}),
                 "matched_by": sorted({k for l in leaks_of[(source, r["image_id"])]
                                       for k in l.matched_by}),
                 "evaluation_images": sorted({f"{l.source}/{l.image_id}"
                                              for l in leaks_of[(source, r["image_id"])]})}
                for r in rows]
            before = report.sources.get(source, {})
            result.counts[source] = {
                "images_before": int(before.get("images", 0)),
                "images_removed": sum(r["action"] == "removed" for r in rows),
                "images_uncaptioned": sum(r["action"] == "uncaptioned" for r in rows),
                "pairs_removed": sum(len(r["captions"] or []) for r in rows)}
        for source, s in report.sources.items():
            if s["domain"] != "downstream" and source not in result.counts:
                result.counts[source] = {"images_before": s["images"], "images_removed": 0,
                                         "images_uncaptioned": 0, "pairs_removed": 0}
        if manifest.is_file():
            _update_manifest(manifest, stage / MANIFEST_NAME, removed_rows,
                             set(result.files_dropped))
        write_json_atomic(stage / EXCLUSION_FILE, {
            "rule": "UNITER A.1: no image of a downstream evaluation split in pretraining",
            "audited": str(root), "settings": report.settings, **result.to_json()})
    return result


def _update_manifest(src: Path, dst: Path, removed: dict[str, list[dict]],
                     dropped_files: set[str]) -> None:
    import json
    raw = json.loads(src.read_text())
    for source, rows in removed.items():
        info = raw["sources"][source]
        gone = [r for r in rows if r["action"] == "removed"]
        info["images"] -= len(gone)
        info["pairs"] -= sum(len(r["captions"] or []) for r in rows)
        per_split = Counter(r["split"] for r in gone)
        for split, n in per_split.items():
            if split in info.get("splits", {}):
                info["splits"][split] -= n
        info["files"] = {sp: [f for f in fs if f not in dropped_files]
                         for sp, fs in info["files"].items()}
    raw.setdefault("sidecars", {})["leak_exclusion"] = EXCLUSION_FILE
    write_json_atomic(dst, raw)
