"""Bottom-up-attention feature TSVs: the original 6-column layout and LXMERT's 10 columns.

Original (peteanderson80/bottom-up-attention ``generate_tsv.py``), one image per line::

    image_id  image_w  image_h  num_boxes  boxes  features

LXMERT (airsplay/lxmert, also used by VisualBERT/VL-BERT ports) — note height before width::

    img_id  img_h  img_w  objects_id  objects_conf  attrs_id  attrs_conf  num_boxes  boxes  features

Array columns are base64 of raw little-endian arrays: boxes float32 N×4 (x1, y1, x2, y2 in
pixels of the original image), features float32 N×D (D = 2048 for the ResNet-101 detector),
objects_id / attrs_id int64 N, objects_conf / attrs_conf float32 N.

Decisions: the 6-column layout carries no detector confidence, so every box gets confidence
1.0 (its boxes already passed the extractor's threshold); the shard metadata says so. The
LXMERT layout keeps only each box's top class, so its soft labels (``--soft-labels
from-objects``) are one-hot at class ``objects_id + 1`` over 1601 classes (0 = background):
MRC's hard label is exact, MRC-kl degenerates to MRC. Attributes are not stored.
"""

from __future__ import annotations

import base64
import binascii
from pathlib import Path
from typing import Iterator

import numpy as np

from vlp.datasets.importers.import_error import InputFormatError, line
from vlp.datasets.importers.feature_import import (APPEND, CLASS_NAMES, DEFAULT_EXTRACTOR, DOMAIN,
                                                   SHARD_MB, SOURCE, SPLIT, extractor_option,
                                                   write_features)
from vlp.datasets.importers.image_ids import canonical_image_id
from vlp.datasets.importers.image_writer import Record
from vlp.datasets.importers.readers import iter_tsv
from vlp.datasets.importers.registry import Importer, ImportReport, Option, register

BUTD_FIELDS = ("image_id", "image_w", "image_h", "num_boxes", "boxes", "features")
LXMERT_FIELDS = ("img_id", "img_h", "img_w", "objects_id", "objects_conf", "attrs_id",
                 "attrs_conf", "num_boxes", "boxes", "features")
VG_CLASSES = 1601  # 1600 Visual Genome object classes + background at index 0


def _int(path: Path, n: int, name: str, text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise InputFormatError(path, f"{text[:40]!r} is not an integer", line(n, name)) from None


def _array(path: Path, n: int, name: str, text: str, dtype: str, count: int,
           width: int | None = 1) -> np.ndarray:
    """Decode one base64 column into a (count, width) array (width None: infer it)."""
    if text.startswith(("b'", 'b"')):
        raise InputFormatError(path, "holds a Python bytes literal (b'...'), not base64 text: "
                                     "the writer forgot to .decode() the base64", line(n, name))
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as e:
        raise InputFormatError(path, f"not valid base64 ({e})", line(n, name)) from None
    item = np.dtype(dtype).itemsize
    if width is None:
        if count == 0 or len(raw) % (count * item):
            raise InputFormatError(path, f"{len(raw)} bytes do not divide into num_boxes = "
                                         f"{count} rows of {dtype}", line(n, name))
        width = len(raw) // (count * item)
    if len(raw) != count * width * item:
        raise InputFormatError(path, f"{len(raw)} bytes, expected num_boxes × {width} × "
                                     f"{item} ({dtype}) = {count * width * item}", line(n, name))
    return np.frombuffer(raw, dtype=dtype).reshape(count, width)


def _vector(path: Path, n: int, name: str, text: str, dtype: str, count: int) -> np.ndarray:
    return _array(path, n, name, text, dtype, count, 1).reshape(count)


def _rows(inputs: list[Path], layout: str, source: str, split: str, soft_labels: str
          ) -> Iterator[tuple[dict, Record]]:
    lxmert = layout == "lxmert"
    fields = LXMERT_FIELDS if lxmert else BUTD_FIELDS
    for path in inputs:
        for n, f in iter_tsv(path, None, ", ".join(fields)):
            if len(f) != len(fields):
                other = len(BUTD_FIELDS if lxmert else LXMERT_FIELDS)
                hint = (f"; a {other}-field line is the "
                        f"{'butd-tsv' if lxmert else 'lxmert-tsv'} layout"
                        if len(f) == other else "")
                raise InputFormatError(path, f"{len(f)} tab-separated fields, expected "
                                             f"{len(fields)} ({', '.join(fields)}){hint}",
                                       line(n))
            col = dict(zip(fields, f))
            num = _int(path, n, "num_boxes", col["num_boxes"])
            if num < 1:
                raise InputFormatError(path, f"num_boxes = {num}; an image needs at least one "
                                             f"region", line(n, "num_boxes"))
            if lxmert:
                raw_id, w, h = col["img_id"], col["img_w"], col["img_h"]
            else:
                raw_id, w, h = col["image_id"], col["image_w"], col["image_h"]
            if not raw_id.strip():
                raise InputFormatError(path, "empty image id", line(n, fields[0]))
            width = _int(path, n, "img_w" if lxmert else "image_w", w)
            height = _int(path, n, "img_h" if lxmert else "image_h", h)
            boxes = _array(path, n, "boxes", col["boxes"], "<f4", num, 4)
            feats = _array(path, n, "features", col["features"], "<f4", num, None)
            row = {"image_id": canonical_image_id(raw_id), "source": source, "split": split,
                   "width": width, "height": height, "boxes": boxes, "features": feats,
                   "confidences": np.ones(num, np.float32), "captions": None}
            if lxmert:
                row["confidences"] = _vector(path, n, "objects_conf", col["objects_conf"],
                                             "<f4", num)
                if soft_labels == "from-objects":
                    obj = _vector(path, n, "objects_id", col["objects_id"], "<i8", num)
                    bad = (obj < 0) | (obj >= VG_CLASSES - 1)
                    if bad.any():
                        k = int(np.flatnonzero(bad)[0])
                        raise InputFormatError(path, f"object class {obj[k]} of box {k} is "
                                                     f"outside 0..{VG_CLASSES - 2}",
                                               line(n, "objects_id"))
                    soft = np.zeros((num, VG_CLASSES), np.float32)
                    soft[np.arange(num), obj + 1] = 1.0
                    row["soft_labels"] = soft
            yield row, Record(path, line(n))


def _runner(layout: str):
    def run(inputs: list[Path], out: Path, *, overwrite: bool, source: str, split: str,
            domain: str | None, feature_extractor: str, shard_mb: float, append: bool,
            soft_labels: str = "none", class_names: str | None = None) -> ImportReport:
        name = "lxmert-tsv" if layout == "lxmert" else "butd-tsv"
        if layout == "butd":
            meta = {"confidences": "absent in the 6-column TSV; set to 1.0"}
        else:
            meta = {"soft_labels": "one-hot at objects_id + 1" if soft_labels == "from-objects"
                    else "none"}
        options = {"source": source, "split": split, "domain": domain,
                   "feature_extractor": feature_extractor,
                   "soft_labels": soft_labels if layout == "lxmert" else None}
        return write_features(name, _rows(inputs, layout, source, split, soft_labels), inputs,
                              out, source=source, split=split, domain=domain,
                              overwrite=overwrite, feature_extractor=feature_extractor,
                              shard_mb=shard_mb, extra_meta=meta, options=options,
                              class_names_file=class_names, append=append)
    return run


register(Importer(
    name="butd-tsv", kind="features",
    summary="bottom-up-attention feature TSV, original 6 columns → image shards",
    inputs="one or more .tsv files",
    description="Original bottom-up-attention TSV (generate_tsv.py): image_id, image_w, "
                "image_h, num_boxes, boxes, features; boxes float32 N×4 pixels, features "
                "float32 N×D, both base64. No confidences in this layout: every box gets 1.0. "
                "Writes OUT/images/SOURCE/part-*.parquet (captions are attached later by a "
                "caption import).",
    run=_runner("butd"),
    options=(SOURCE, SPLIT, DOMAIN, APPEND, extractor_option(DEFAULT_EXTRACTOR), SHARD_MB)))

register(Importer(
    name="lxmert-tsv", kind="features",
    summary="LXMERT-layout feature TSV, 10 columns → image shards",
    inputs="one or more .tsv files",
    description="LXMERT TSV: img_id, img_h, img_w (height first!), objects_id, objects_conf, "
                "attrs_id, attrs_conf, num_boxes, boxes, features; ids int64, confidences "
                "float32, boxes float32 N×4 pixels, features float32 N×D, all base64. "
                "objects_conf becomes the box confidence; objects_id can become one-hot soft "
                "labels over 1601 classes (see --soft-labels). Writes OUT/images/SOURCE/.",
    run=_runner("lxmert"),
    options=(SOURCE, SPLIT, DOMAIN, APPEND, extractor_option(DEFAULT_EXTRACTOR), SHARD_MB,
             CLASS_NAMES,
             Option("--soft-labels", "from-objects: one-hot soft labels at objects_id + 1 "
                                     "(1601 classes, MRC targets; +115 KB per 36-box image); "
                                     "none: store no soft labels",
                    default="from-objects", choices=("from-objects", "none")))))
