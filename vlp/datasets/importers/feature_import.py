"""What the three feature importers share: options, and writing ``images/<source>/``."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Iterable

from vlp.datasets.importers.data_folder import (check_compatible, default_domain, images_dir,
                                                import_record, new_world, read_world, staged_folder,
                                                update_world)
from vlp.datasets.importers.image_writer import ImageShardWriter, Record
from vlp.datasets.importers.registry import ImportReport, Option
from vlp.datasets.storage.shards import list_shards, read_image_shard, shard_info
from vlp.datasets.storage.shard_format import SPLITS, ShardInfo

DEFAULT_EXTRACTOR = "butd-r101-vg"  # Anderson et al.'s Caffe Faster R-CNN, ResNet-101, VG
DEFAULT_SHARD_MB = 128.0
DOMAINS = ("in", "out", "downstream")

SOURCE = Option("--source", "corpus name; the shards go to OUT/images/SOURCE/ (coco, vg, cc, "
                            "sbu, flickr30k, nlvr2, vcr, ...)", required=True)
SPLIT = Option("--split", "split of every image (a Karpathy caption import can set it per "
                          "image later)", default="train", choices=SPLITS)
DOMAIN = Option("--domain", "in / out (pretraining corpora, UNITER's in-domain COCO+VG and "
                            "out-of-domain CC+SBU) or downstream (images only tasks use); "
                            "default: in for coco and vg, out for cc and sbu, else downstream",
                choices=DOMAINS)
APPEND = Option("--append", "add these images to an existing OUT/images/SOURCE/ (e.g. its val "
                            "split after its train split) instead of refusing; ids must be new",
                flag_only=True)
SHARD_MB = Option("--shard-mb", "target size of one shard file in MB of features",
                  default=DEFAULT_SHARD_MB, type=float)
CLASS_NAMES = Option("--class-names", "text file with the detector's class names, one per line "
                                      "(VG objects_vocab.txt: 1600 names, background is "
                                      "prepended; text after a comma is a synonym); default: "
                                      "placeholder names class1, class2, ...")


def extractor_option(default: str) -> Option:
    return Option("--feature-extractor", "name of the detector that made the features, "
                                         "recorded in every shard's metadata and the manifest "
                                         "(stores of different extractors are never mixed "
                                         "unknowingly)", default=default)


def class_names(num_classes: int, path: str | None) -> list[str]:
    """Names for the soft-label classes, index 0 = background."""
    if not num_classes:
        return []
    if path is None:
        return ["__background__"] + [f"class{i}" for i in range(1, num_classes)]
    names = [ln.split(",")[0].strip() for ln in Path(path).read_text().splitlines()
             if ln.strip()]
    if len(names) == num_classes - 1:
        names = ["__background__"] + names
    if len(names) != num_classes:
        raise ValueError(f"--class-names {path}: {len(names)} names, but the soft labels have "
                         f"{num_classes} classes (background included)")
    return names


def _existing(folder: Path) -> tuple[list[Path], dict[str, Record], ShardInfo]:
    """The shards already in ``folder``, their image ids, and what their metadata says."""
    files = list_shards(folder)
    if not files:
        raise FileNotFoundError(f"--append: {folder} holds no image shards")
    ids: dict[str, Record] = {}
    for f in files:
        table, _ = read_image_shard(f, validate=False, columns=["image_id"])
        for i in table.column("image_id").to_pylist():
            ids[i] = Record(f, "an earlier import")
    return files, ids, shard_info(files[0])


def _link_or_copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)  # same file system: instant, no second copy on disk
    except OSError:
        shutil.copy2(src, dst)


def write_features(importer: str, rows: Iterable[tuple[dict, Record]], inputs: list[Path],
                   out: Path, *, source: str, split: str, domain: str | None, overwrite: bool,
                   feature_extractor: str, shard_mb: float, extra_meta: dict, options: dict,
                   class_names_file: str | None = None, append: bool = False) -> ImportReport:
    """Stream ``rows`` into ``OUT/images/<source>/`` (staged, swapped in whole) + manifest.

    With ``append`` the source's existing shards are kept (hard-linked into the staging
    folder) and the new images are added as more ``<split>-NNNNN`` files — how the splits of
    one corpus arrive as separate feature files (COCO train2014 / val2014, NLVR2 train /
    dev / test).
    """
    if shard_mb <= 0:
        raise ValueError(f"--shard-mb must be positive, got {shard_mb}")
    if append and overwrite:
        raise ValueError("--append keeps the existing shards, --overwrite replaces them: "
                         "give one")
    final = images_dir(out, source)
    old_files, old_ids, old_info = _existing(final) if append and final.exists() else (
        [], {}, None)
    if old_info is not None:
        world = read_world(out)
        old_entry = world.sources.get(source) if world else None
        old_domain = old_entry.domain if old_entry else old_info.extra.get("domain")
        if domain and old_domain and domain != old_domain:
            raise ValueError(f"--domain {domain}, but {final} is domain {old_domain!r}")
        domain = domain or old_domain
    domain = domain or default_domain(source)
    meta = {"importer": importer, "domain": domain, **extra_meta}
    start = sum(f.name.startswith(f"{split}-") for f in old_files)
    with staged_folder(final, overwrite=overwrite or bool(old_files)) as staging:
        for f in old_files:
            _link_or_copy(f, staging / f.relative_to(final))
        writer = ImageShardWriter(staging, feature_extractor, split, meta,
                                  target_bytes=max(1, int(shard_mb * (1 << 20))), start=start)
        writer.seen.update(old_ids)
        for row, record in rows:
            writer.add(row, record)
        infos = writer.close()
        if not infos:
            raise ValueError(f"{importer}: the input held no images: {[str(p) for p in inputs]}")
        dim, classes = writer.feature_dim, writer.num_classes or 0
        if old_info is not None and (old_info.feature_dim, old_info.feature_extractor) != (
                dim, feature_extractor):
            raise ValueError(f"--append: {final} holds {old_info.feature_dim}-d features of "
                             f"{old_info.feature_extractor!r}; these are {dim}-d of "
                             f"{feature_extractor!r}")
        names = class_names(classes, class_names_file)
        check_compatible(read_world(out), source, feature_dim=dim, num_classes=classes,
                         feature_extractor=feature_extractor)
    files = [f"images/{source}/{Path(i.path).name}" for i in infos]
    counts = {"images": writer.num_images - len(old_ids), "shards": len(infos)}

    def change(world) -> None:
        from vlp.datasets.storage.world import SourceInfo
        check_compatible(world, source, feature_dim=dim, num_classes=classes,
                         feature_extractor=feature_extractor)
        if not [s for s in world.sources if s != source]:  # (re)defines the world
            world.feature_dim, world.feature_extractor = dim, feature_extractor
            world.num_classes, world.class_names = classes, names
        elif classes and not world.num_classes:
            world.num_classes, world.class_names = classes, names
        old = world.sources.get(source) if old_files else None
        by_split = {k: list(v) for k, v in (old.files if old else {}).items()}
        by_split.setdefault(split, []).extend(files)
        per_split = dict(old.splits) if old else {}
        per_split[split] = per_split.get(split, 0) + counts["images"]
        world.sources[source] = SourceInfo(folder=f"images/{source}", domain=domain,
                                           images=writer.num_images,
                                           pairs=old.pairs if old else 0,
                                           files=by_split, splits=per_split)
    update_world(out, change,
                 create=lambda: new_world(out, feature_dim=dim, num_classes=classes,
                                          class_names=names,
                                          feature_extractor=feature_extractor),
                 log=import_record(importer, inputs, counts, options, files))
    return ImportReport(importer, [Path(out) / f for f in files], counts)
