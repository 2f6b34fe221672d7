"""What the driver keeps of an extraction: which shards ``OUT/images/<source>/`` already holds
(a rerun extracts only the rest), and the manifest, committed after every shard the workers
write (shard_stage.py), so an interrupted run keeps every finished shard. ``OUT`` is a local
or mounted folder or a URI (``s3://bucket/world``).

A folder holding features of another extractor, other settings or other weights is refused,
since the rerun would mix them. On object storage the manifest has no lock: one extraction
writes into a world at a time.
"""

from __future__ import annotations

import json
import posixpath
from pathlib import Path

from vlp.contract import uri_files
from vlp.datasets.importers.data_folder import (IMPORT_LOG, check_compatible, default_domain,
                                                import_record, new_world, read_world,
                                                update_world)
from vlp.datasets.importers.feature_import import class_names
from vlp.datasets.storage.shards import list_shards, read_image_shard, shard_info

# given boxes (--boxes) too: features of other boxes must not join a folder either
IDENTITY_KEYS = ("extract_settings", "weights_sha256", "given_boxes")


class ExistingShards:
    """What ``OUT/images/<source>/`` already holds: image ids, and the first shard's metadata."""

    def __init__(self, folder: Path | str):
        self.folder = folder
        there = uri_files.kind(folder) == "dir"
        self.files = list_shards(folder) if there else []
        self.ids: set[str] = set()
        for f in self.files:
            table, _ = read_image_shard(f, validate=False, columns=["image_id"])
            self.ids.update(table.column("image_id").to_pylist())
        self.info = shard_info(self.files[0]) if self.files else None

    def problem(self, extractor: str, meta: dict[str, str]) -> str | None:
        """Why this run cannot add to the folder (None when it can)."""
        if self.info is None:
            return None
        have = self.info.extra or {}
        if self.info.feature_extractor != extractor or any(
                have.get(k) != meta.get(k) for k in IDENTITY_KEYS):
            keys = [k for k in IDENTITY_KEYS if have.get(k) or meta.get(k)]
            return (f"{self.folder} holds features of {self.info.feature_extractor!r} "
                    f"({', '.join(f'{k} {have.get(k)}' for k in keys)}); this run "
                    f"is {extractor!r} ({', '.join(f'{k} {meta.get(k)}' for k in keys)})"
                    f": use another --source or --out")
        return None



def load_world(out: str):
    """``OUT``'s manifest (local or by URI), or None when it has none yet."""
    if not uri_files.is_uri(out):
        return read_world(Path(out))
    from vlp.datasets.storage.world import MANIFEST_NAME, load_manifest
    if uri_files.kind(uri_files.join(out, MANIFEST_NAME)) != "file":
        return None
    return load_manifest(out, check_files=False)


def _write_bytes(uri: str, data: bytes) -> None:
    fs, path = uri_files.filesystem(uri)
    with fs.open_output_stream(path) as f:     # visible once the upload completes
        f.write(data)


def update_world_at(out: str, change, create, log: dict | None) -> None:
    """``update_world`` for a local folder (locked) or a URI (no lock: one writer)."""
    if not uri_files.is_uri(out):
        update_world(Path(out), change, create=create, log=log)
        return
    from vlp.datasets.storage.world import MANIFEST_NAME
    world = load_world(out) or create()
    change(world)
    if log is not None:
        where = str(uri_files.join(out, IMPORT_LOG))
        old = uri_files.read_bytes(where) if uri_files.kind(where) == "file" else b""
        _write_bytes(where, old + (json.dumps(log, sort_keys=True) + "\n").encode())
        world.sidecars["imports"] = IMPORT_LOG
    _write_bytes(str(uri_files.join(out, MANIFEST_NAME)),
                 json.dumps(world.to_json(), indent=2, sort_keys=True).encode())


class ManifestCommit:
    """The driver's side of the output: shards the workers wrote, listed in the manifest."""

    def __init__(self, out: str, source: str, extractor: str, existing: ExistingShards):
        self.out, self.source, self.extractor = out, source, extractor
        world = load_world(out)
        entry = world.sources.get(source) if world else None
        self.domain = entry.domain if entry else default_domain(source)
        self.feature_dim = existing.info.feature_dim if existing.info else None
        self.num_classes = existing.info.num_classes if existing.info else None
        self.shards_written = 0
        # rows per shard file, read once: the manifest is rewritten after every shard, and
        # re-reading every footer each time would grow quadratically over a long run
        self.file_rows = {f"images/{source}/{posixpath.basename(str(f))}": shard_info(f).num_rows
                          for f in existing.files}

    def writer_meta(self, meta: dict[str, str]) -> dict[str, str]:
        """The metadata every shard of this run records (the workers' shard writer's)."""
        return {"importer": "vlp data extract", "domain": self.domain, **meta}

    def add(self, shard: str, rows: int, feature_dim: int, num_classes: int) -> None:
        """A shard a worker wrote: listed in the manifest now."""
        self.file_rows[shard] = rows
        self.feature_dim, self.num_classes = feature_dim, num_classes or None
        self.shards_written += 1
        self._update_manifest(log=None)

    def finish(self, log: dict) -> None:
        self._update_manifest(log=log)

    def _update_manifest(self, log: dict | None) -> None:
        if not self.file_rows:
            return
        dim = self.feature_dim
        classes = self.num_classes or 0
        names = class_names(classes, None)
        by_split: dict[str, list[str]] = {}
        per_split: dict[str, int] = {}
        for rel, rows in sorted(self.file_rows.items()):
            split = posixpath.basename(rel).split("-")[0]
            by_split.setdefault(split, []).append(rel)
            per_split[split] = per_split.get(split, 0) + rows
        source, extractor, domain = self.source, self.extractor, self.domain

        def change(world) -> None:
            from vlp.datasets.storage.world import SourceInfo
            check_compatible(world, source, feature_dim=dim, num_classes=classes,
                             feature_extractor=extractor)
            if not [s for s in world.sources if s != source]:
                world.feature_dim, world.feature_extractor = dim, extractor
                world.num_classes, world.class_names = classes, names
            old = world.sources.get(source)
            world.sources[source] = SourceInfo(
                folder=f"images/{source}", domain=domain, images=sum(per_split.values()),
                pairs=old.pairs if old else 0, files=by_split, splits=per_split)
        update_world_at(self.out, change,
                        create=lambda: new_world(Path(str(self.out).rstrip("/")),
                                                 feature_dim=dim, num_classes=classes,
                                                 class_names=names,
                                                 feature_extractor=extractor),
                        log=log)


def extract_record(inputs: list[str], counts: dict, options: dict, outputs: list[str]) -> dict:
    return import_record("vlp data extract", [], counts, options, outputs) | {"inputs": inputs}
