"""What the three feature importers share: options, and writing ``images/<source>/``."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

from vlp.datasets.importers.data_folder import (check_compatible, default_domain, images_dir,
                                                import_record, new_world, read_world,
                                                staged_folder, update_world)
from vlp.datasets.importers.image_writer import ImageShardWriter, Record
from vlp.datasets.importers.registry import ImportReport, Option
from vlp.datasets.shards import SPLITS

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


def write_features(importer: str, rows: Iterable[tuple[dict, Record]], inputs: list[Path],
                   out: Path, *, source: str, split: str, domain: str | None, overwrite: bool,
                   feature_extractor: str, shard_mb: float, extra_meta: dict, options: dict,
                   class_names_file: str | None = None) -> ImportReport:
    """Stream ``rows`` into ``OUT/images/<source>/`` (staged, swapped in whole) + manifest."""
    if shard_mb <= 0:
        raise ValueError(f"--shard-mb must be positive, got {shard_mb}")
    domain = domain or default_domain(source)
    final = images_dir(out, source)
    meta = {"importer": importer, "domain": domain, **extra_meta}
    with staged_folder(final, overwrite) as staging:
        writer = ImageShardWriter(staging, feature_extractor, split, meta,
                                  target_bytes=max(1, int(shard_mb * (1 << 20))))
        for row, record in rows:
            writer.add(row, record)
        infos = writer.close()
        if not infos:
            raise ValueError(f"{importer}: the input held no images: {[str(p) for p in inputs]}")
        dim, classes = writer.feature_dim, writer.num_classes or 0
        names = class_names(classes, class_names_file)
        check_compatible(read_world(out), source, feature_dim=dim, num_classes=classes,
                         feature_extractor=feature_extractor)
    files = [f"images/{source}/{Path(i.path).name}" for i in infos]
    counts = {"images": writer.num_images, "shards": len(infos)}

    def change(world) -> None:
        from vlp.datasets.world import SourceInfo
        check_compatible(world, source, feature_dim=dim, num_classes=classes,
                         feature_extractor=feature_extractor)
        if not [s for s in world.sources if s != source]:  # (re)defines the world
            world.feature_dim, world.feature_extractor = dim, feature_extractor
            world.num_classes, world.class_names = classes, names
        elif classes and not world.num_classes:
            world.num_classes, world.class_names = classes, names
        world.sources[source] = SourceInfo(folder=f"images/{source}", domain=domain,
                                           images=writer.num_images, pairs=0,
                                           files={split: files},
                                           splits={split: writer.num_images})
    update_world(out, change,
                 create=lambda: new_world(out, feature_dim=dim, num_classes=classes,
                                          class_names=names,
                                          feature_extractor=feature_extractor),
                 log=import_record(importer, inputs, counts, options, files))
    return ImportReport(importer, [Path(out) / f for f in files], counts)
