"""Attach captions to image shards by image id — the second step of every caption import.

Caption files (Karpathy JSON, VG region descriptions, CC TSV, SBU) carry text and an image
id; features come from a feature import. The merge reads ``images/<source>/`` (or
``--features``), adds each image's captions (appending to captions already there, skipping
exact repeats, so re-running an import changes nothing), optionally sets each image's split,
regroups the rows into ``<split>-NNNNN.parquet`` files and swaps the folder in whole.
Captions whose image has no features are an error, with their count and the first such
record, unless ``--allow-missing-features`` drops them.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from vlp.datasets.importers.data_folder import (check_compatible, default_domain, images_dir,
                                                import_record, new_world, read_world,
                                                refuse_existing, staged_folder, update_world)
from vlp.datasets.importers.feature_import import DEFAULT_SHARD_MB, class_names
from vlp.datasets.importers.import_error import InputFormatError
from vlp.datasets.importers.registry import ImportReport, Option
from vlp.datasets.storage.shards import list_shards, read_image_shard, write_image_shard
from vlp.datasets.storage.shard_format import SPLITS

FEATURES = Option("--features", "folder of image shards to attach the captions to (default: "
                                "OUT/images/SOURCE/, written by a feature import); the result "
                                "replaces OUT/images/SOURCE/")
ALLOW_MISSING = Option("--allow-missing-features", "drop (and count) captions whose image has "
                                                   "no features instead of failing",
                       flag_only=True)


@dataclass
class Captions:
    """Captions per canonical image id, with the first input record of each image."""
    by_image: dict[str, list[str]] = field(default_factory=dict)
    first_record: dict[str, tuple[Path, str]] = field(default_factory=dict)
    split: dict[str, str] = field(default_factory=dict)
    count: int = 0

    def add(self, image_id: str, caption: str, path: Path, record: str) -> None:
        text = " ".join(caption.split())  # one line, single spaces: captions are tokenized later
        if not text:
            raise InputFormatError(path, "empty caption", record)
        if image_id not in self.by_image:
            self.by_image[image_id] = []
            self.first_record[image_id] = (path, record)
        self.by_image[image_id].append(text)
        self.count += 1

    def set_split(self, image_id: str, split: str, path: Path, record: str) -> None:
        if split not in SPLITS:
            raise InputFormatError(path, f"split {split!r}, expected one of {SPLITS}", record)
        self.split[image_id] = split


def _shard_ids(files: list[Path]) -> set[str]:
    ids: set[str] = set()
    for f in files:
        table, _ = read_image_shard(f, validate=False, columns=["image_id"])
        ids.update(table.column("image_id").to_pylist())
    return ids


class _SplitShards:
    """Rows regrouped by split (a Karpathy import can move images between splits) into
    ``<split>-NNNNN.parquet`` files of about the feature importers' shard size."""

    def __init__(self, folder: Path, target_bytes: int):
        self.folder, self.target = folder, target_bytes
        self.pending: dict[str, list[pa.Table]] = {}
        self.files: dict[str, list[str]] = {}
        self.images: dict[str, int] = {}
        self.meta: dict | None = None

    def add(self, table: pa.Table, info) -> None:
        self.meta = {"feature_extractor": info.feature_extractor,
                     "feature_dim": info.feature_dim, "num_classes": info.num_classes,
                     "extra_meta": info.extra}
        split = table.column("split")
        for name in sorted(set(split.to_pylist())):
            part = table.filter(pc.equal(split, name))
            self.pending.setdefault(name, []).append(part)
            self.images[name] = self.images.get(name, 0) + part.num_rows
            if sum(t.nbytes for t in self.pending[name]) >= self.target:
                self._flush(name)

    def close(self) -> None:
        for name in list(self.pending):
            if self.pending[name]:
                self._flush(name)

    def _flush(self, split: str) -> None:
        files = self.files.setdefault(split, [])
        path = self.folder / f"{split}-{len(files):05d}.parquet"
        write_image_shard(path, pa.concat_tables(self.pending[split]), **self.meta)
        files.append(path.name)
        self.pending[split] = []


def merge_captions(importer: str, caps: Captions, inputs: list[Path], out: Path, *,
                   source: str, features: str | None, allow_missing_features: bool,
                   overwrite: bool, options: dict) -> ImportReport:
    final = images_dir(out, source)
    src = Path(features) if features else final
    if not src.is_dir():
        raise FileNotFoundError(f"no image shards at {src}: import the features first (e.g. "
                                f"`vlp data import butd-tsv FILE.tsv --source {source} --out "
                                f"{out}`) or point --features at them")
    files = list_shards(src)
    if not files:
        raise FileNotFoundError(f"{src} holds no image shards")
    if src.resolve() != final.resolve():
        refuse_existing(final, overwrite)
    if not caps.by_image:
        raise InputFormatError(inputs[0], "holds no captions")

    have = _shard_ids(files)
    missing = [i for i in caps.by_image if i not in have]
    n_missing_caps = sum(len(caps.by_image[i]) for i in missing)
    if missing and not allow_missing_features:
        path, record = caps.first_record[missing[0]]
        raise InputFormatError(path, f"image {missing[0]!r} has no features in {src}; "
                                     f"{n_missing_caps} caption(s) of {len(missing)} image(s) "
                                     f"lack features (pass --allow-missing-features to drop "
                                     f"them)", record)

    added = total = captioned = images = 0
    note = f"{importer}:{','.join(p.name for p in inputs)}"
    with staged_folder(final, overwrite=True) as staging:
        out_shards = _SplitShards(staging, int(DEFAULT_SHARD_MB * (1 << 20)))
        for f in files:
            table, info = read_image_shard(f)
            ids = table.column("image_id").to_pylist()
            old = table.column("captions").to_pylist()
            new_caps, new_split = [], table.column("split").to_pylist()
            for k, (image_id, before) in enumerate(zip(ids, old)):
                merged = list(before or [])
                seen = set(merged)
                for c in caps.by_image.get(image_id, ()):
                    if c not in seen:
                        merged.append(c)
                        seen.add(c)
                        added += 1
                new_caps.append(merged or None)
                total += len(merged)
                captioned += bool(merged)
                new_split[k] = caps.split.get(image_id, new_split[k])
            images += len(ids)
            table = table.set_column(table.schema.get_field_index("captions"), "captions",
                                     pa.array(new_caps, pa.list_(pa.string())))
            table = table.set_column(table.schema.get_field_index("split"), "split",
                                     pa.array(new_split, pa.string()))
            extra = dict(info.extra or {})
            extra["captions_from"] = "; ".join(filter(None, [extra.get("captions_from"), note]))
            out_shards.add(table, replace(info, extra=extra))
        out_shards.close()
        meta = out_shards.meta
        _check_world(out, source, meta)

    rel = {sp: [f"images/{source}/{n}" for n in names]
           for sp, names in sorted(out_shards.files.items())}
    counts = {"images": images, "captioned_images": captioned, "captions": total,
              "captions_added": added}
    notes = []
    if missing:
        counts["dropped_captions_without_features"] = n_missing_caps
        notes.append(f"dropped {n_missing_caps} caption(s) of {len(missing)} image(s) without "
                     f"features (e.g. {missing[:3]})")
    if images - captioned:
        notes.append(f"{images - captioned} image(s) have features but no captions")

    def change(world) -> None:
        from vlp.datasets.storage.world import SourceInfo
        old = world.sources.get(source)
        domain = old.domain if old else (meta["extra_meta"] or {}).get(
            "domain", default_domain(source))
        world.sources[source] = SourceInfo(
            folder=f"images/{source}", domain=domain, images=images, pairs=total, files=rel,
            splits={sp: out_shards.images[sp] for sp in rel})

    def create():
        classes = meta["num_classes"] or 0
        return new_world(out, feature_dim=meta["feature_dim"], num_classes=classes,
                         class_names=class_names(classes, None),
                         feature_extractor=meta["feature_extractor"])
    update_world(out, change, create=create,
                 log=import_record(importer, inputs, counts, options,
                                   [f for fs in rel.values() for f in fs]))
    written = [Path(out) / f for fs in rel.values() for f in fs]
    return ImportReport(importer, written, counts, notes)


def _check_world(out: Path, source: str, meta: dict) -> None:
    check_compatible(read_world(out), source, feature_dim=meta["feature_dim"],
                     num_classes=meta["num_classes"],
                     feature_extractor=meta["feature_extractor"])
