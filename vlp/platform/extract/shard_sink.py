"""Where extracted rows go: ``OUT/images/<source>/<split>-NNNNN.parquet`` through the project's
validating shard writer, the manifest updated after every shard.

Unlike an import (built in a staging folder, swapped in whole), an extraction commits shard by
shard: each file is written atomically (temporary name, rename) and only then listed in the
manifest, so an interrupted run keeps every finished shard, and a rerun reads their image ids
and extracts only the rest. A folder holding features of another extractor, other settings or
other weights is refused, since the rerun would mix them.
"""

from __future__ import annotations

from pathlib import Path

from vlp.datasets.importers.data_folder import (check_compatible, default_domain, images_dir,
                                                import_record, new_world, read_world,
                                                update_world)
from vlp.datasets.importers.feature_import import class_names
from vlp.datasets.importers.image_writer import ImageShardWriter, Record
from vlp.datasets.storage.shards import list_shards, read_image_shard, shard_info

IDENTITY_KEYS = ("extract_settings", "weights_sha256")


class ExistingShards:
    """What ``OUT/images/<source>/`` already holds: image ids, and the first shard's metadata."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.files = list_shards(folder) if folder.is_dir() else []
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
            return (f"{self.folder} holds features of {self.info.feature_extractor!r} "
                    f"({', '.join(f'{k} {have.get(k)}' for k in IDENTITY_KEYS)}); this run "
                    f"is {extractor!r} ({', '.join(f'{k} {meta.get(k)}' for k in IDENTITY_KEYS)})"
                    f": use another --source or --out")
        return None

    def next_number(self, split: str) -> int:
        return sum(Path(f).name.startswith(f"{split}-") for f in self.files)


class ShardSink:
    """Rows in, shards out; ``add`` returns a failure line for a row the writer refuses."""

    def __init__(self, out: Path, source: str, split: str, extractor: str,
                 meta: dict[str, str], existing: ExistingShards, images_per_shard: int):
        self.out, self.source, self.split, self.extractor = Path(out), source, split, extractor
        self.folder = images_dir(out, source)
        world = read_world(out)
        entry = world.sources.get(source) if world else None
        self.domain = entry.domain if entry else default_domain(source)
        self.images_per_shard = images_per_shard
        self.folder.mkdir(parents=True, exist_ok=True)
        self.writer = ImageShardWriter(self.folder, extractor, split,
                                       {"importer": "vlp data extract", "domain": self.domain,
                                        **meta},
                                       target_bytes=1 << 62,   # cut by image count instead
                                       start=existing.next_number(split))
        if existing.info is not None:
            self.writer.feature_dim = existing.info.feature_dim
            self.writer.num_classes = existing.info.num_classes
        self.pending = 0
        self.shards_written = 0
        # rows per shard file, read once: the manifest is rewritten after every shard, and
        # re-reading every footer each time would grow quadratically over a long run
        self.file_rows = {Path(f).relative_to(self.out).as_posix(): shard_info(f).num_rows
                          for f in existing.files}

    def add(self, row: dict, location: str) -> str | None:
        from vlp.datasets.importers.import_error import InputFormatError
        row = {**row, "source": self.source, "split": self.split}
        try:
            self.writer.add(row, Record(Path(location), "extracted"))
        except InputFormatError as e:   # the extractor's output broke the format: that image
            return str(e)
        self.pending += 1
        if self.pending >= self.images_per_shard:
            self.flush()
        return None

    def flush(self) -> None:
        """Write the buffered rows as one shard, then list it in the manifest."""
        if not self.pending:
            return
        before = len(self.writer.written)
        self.writer.close()
        self.pending = 0
        for info in self.writer.written[before:]:
            self.file_rows[Path(info.path).relative_to(self.out).as_posix()] = info.num_rows
        self.shards_written += len(self.writer.written) - before
        self._update_manifest(log=None)

    def finish(self, log: dict) -> None:
        self.flush()
        self._update_manifest(log=log)

    def _update_manifest(self, log: dict | None) -> None:
        if not self.file_rows:
            return
        dim = self.writer.feature_dim
        classes = self.writer.num_classes or 0
        names = class_names(classes, None)
        by_split: dict[str, list[str]] = {}
        per_split: dict[str, int] = {}
        for rel, rows in sorted(self.file_rows.items()):
            split = Path(rel).name.split("-")[0]
            by_split.setdefault(split, []).append(rel)
            per_split[split] = per_split.get(split, 0) + rows
        source, extractor = self.source, self.extractor

        def change(world) -> None:
            from vlp.datasets.storage.world import SourceInfo
            check_compatible(world, source, feature_dim=dim, num_classes=classes,
                             feature_extractor=extractor)
            if not [s for s in world.sources if s != source]:
                world.feature_dim, world.feature_extractor = dim, extractor
                world.num_classes, world.class_names = classes, names
            old = world.sources.get(source)
            world.sources[source] = SourceInfo(
                folder=f"images/{source}", domain=self.domain, images=sum(per_split.values()),
                pairs=old.pairs if old else 0, files=by_split, splits=per_split)
        update_world(self.out, change,
                     create=lambda: new_world(self.out, feature_dim=dim, num_classes=classes,
                                              class_names=names, feature_extractor=extractor),
                     log=log)


def extract_record(inputs: list[str], counts: dict, options: dict, outputs: list[str]) -> dict:
    return import_record("vlp data extract", [], counts, options, outputs) | {"inputs": inputs}
