"""UNITER's per-image feature dumps: one ``<image name>.npz`` per image.

Keys (the BUTD extraction docker UNITER's ``convert_imgdir.py`` reads): ``features`` N×D
float32/16, ``norm_bb`` N×6 float — x1, y1, x2, y2, w, h divided by the image width/height
(UNITER appends w·h as the 7th column at load time; 7-column dumps are accepted too),
``conf`` N detector confidences, optional ``soft_labels`` N×1601 class distribution.
Arrays are loaded with ``allow_pickle=False``: an npz holding Python objects is refused.

Decision on image size: the dumps hold only *normalised* boxes, and image shards store pixel
boxes plus the image size. Either give the real sizes (``--image-sizes``: COCO
``instances_*.json`` / ``image_info_*.json``, VG ``image_data.json``, or a JSON map
``{image_id: [width, height]}``) — needed whenever the boxes are compared with pixel boxes
from elsewhere, e.g. RefCOCO targets — or choose ``--nominal-size S``: boxes are stored on an
S×S canvas, which reproduces the normalised coordinates every model input uses (UNITER 7-d,
ImageBERT 5-d, VL-BERT relative geometry) but not the aspect ratio. The shard metadata
records which (``image_size``).
"""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Iterator

import numpy as np

from vlp.datasets.importers.import_error import InputFormatError
from vlp.datasets.importers.feature_import import (APPEND, CLASS_NAMES, DEFAULT_EXTRACTOR, DOMAIN,
                                                   SHARD_MB, SOURCE, SPLIT, extractor_option,
                                                   write_features)
from vlp.datasets.importers.image_ids import canonical_image_id
from vlp.datasets.importers.image_writer import Record
from vlp.datasets.importers.readers import load_json
from vlp.datasets.importers.registry import Importer, ImportReport, Option, register

NORM_TOLERANCE = 1e-3  # fp16 dumps round 1.0 - ε up to 1.0005


def npz_files(inputs: list[Path]) -> list[Path]:
    files: list[Path] = []
    for p in inputs:
        if p.is_dir():
            found = sorted(p.glob("*.npz"))
            if not found:
                raise InputFormatError(p, "folder holds no .npz files")
            files.extend(found)
        elif p.is_file():
            files.append(p)
        else:
            raise InputFormatError(p, "no such file or folder")
    return files


def load_image_sizes(path: Path) -> dict[str, tuple[int, int]]:
    """image id → (width, height) from a COCO / VG / plain JSON file."""
    doc = load_json(path, expect=(dict, list))
    entries: list[tuple[str, object, object, object]] = []
    if isinstance(doc, dict) and isinstance(doc.get("images"), list):
        doc = doc["images"]  # COCO instances / image_info
    if isinstance(doc, list):
        for i, e in enumerate(doc):
            if not isinstance(e, dict):
                raise InputFormatError(path, "expected an object with id, width, height",
                                       f"images[{i}]")
            key = e.get("image_id", e.get("id"))
            entries.append((f"images[{i}]", key, e.get("width"), e.get("height")))
    else:
        for key, v in doc.items():
            w, h = (v.get("width"), v.get("height")) if isinstance(v, dict) else (
                (v[0], v[1]) if isinstance(v, list) and len(v) == 2 else (None, None))
            entries.append((f"key {key!r}", key, w, h))
    sizes: dict[str, tuple[int, int]] = {}
    for label, key, w, h in entries:
        if key is None or not isinstance(w, int) or not isinstance(h, int) or w <= 0 or h <= 0:
            raise InputFormatError(path, f"expected an image id and positive integer width and "
                                         f"height, got id={key!r} width={w!r} height={h!r}",
                                   label)
        sizes[canonical_image_id(key)] = (w, h)
    return sizes


def _load(path: Path) -> dict[str, np.ndarray]:
    with open(path, "rb") as f:
        if f.read(4) != b"PK\x03\x04":  # np.load would try to unpickle a non-zip file
            raise InputFormatError(path, "not a readable .npz file (not a zip archive)")
    try:
        with np.load(path, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except ValueError as e:  # object arrays need pickle: refused
        raise InputFormatError(path, f"cannot be read without unpickling ({e}); vlp never "
                                     f"unpickles feature dumps") from None
    except (zipfile.BadZipFile, OSError, EOFError) as e:
        raise InputFormatError(path, f"not a readable .npz file ({e})") from None


def _need(path: Path, d: dict, key: str, ndim: int, n: int | None) -> np.ndarray:
    if key not in d:
        raise InputFormatError(path, f"missing array '{key}' (has {sorted(d)})", f"key '{key}'")
    arr = d[key]
    if arr.ndim != ndim or (n is not None and arr.shape[0] != n) or not np.issubdtype(
            arr.dtype, np.floating):
        want = "N" if ndim == 1 else "N×K"
        raise InputFormatError(path, f"shape {arr.shape} dtype {arr.dtype}, expected a float "
                                     f"array of shape {want}" + (f" with N = {n}" if n else ""),
                               f"key '{key}'")
    return arr.astype(np.float32)


def _rows(files: list[Path], source: str, split: str, sizes: dict | None, nominal: int | None
          ) -> Iterator[tuple[dict, Record]]:
    for path in files:
        d = _load(path)
        feats = _need(path, d, "features", 2, None)
        n = feats.shape[0]
        norm = _need(path, d, "norm_bb", 2, n)
        if norm.shape[1] not in (6, 7):
            raise InputFormatError(path, f"norm_bb has {norm.shape[1]} columns, expected 6 "
                                         f"(x1, y1, x2, y2, w, h) or 7 (+ w·h)", "key 'norm_bb'")
        bad = (norm[:, :4] < -NORM_TOLERANCE) | (norm[:, :4] > 1 + NORM_TOLERANCE)
        if bad.any() or not np.isfinite(norm).all():
            k = int(np.flatnonzero(bad.any(1) | ~np.isfinite(norm).all(1))[0])
            raise InputFormatError(path, f"box {k} = {norm[k, :4].tolist()} is not normalised "
                                         f"to [0, 1]", "key 'norm_bb'")
        conf = _need(path, d, "conf", 1, n)
        soft = _need(path, d, "soft_labels", 2, n) if "soft_labels" in d else None
        image_id = canonical_image_id(path.name)
        if sizes is not None:
            if image_id not in sizes:
                raise InputFormatError(path, f"image {image_id!r} has no entry in the "
                                             f"--image-sizes file")
            width, height = sizes[image_id]
        else:
            width = height = nominal
        scale = np.array([width, height, width, height], np.float32)
        boxes = np.clip(norm[:, :4], 0.0, 1.0) * scale
        row = {"image_id": image_id, "source": source, "split": split, "width": width,
               "height": height, "boxes": boxes, "features": feats,
               "confidences": np.clip(conf, 0.0, 1.0) if np.isfinite(conf).all() else conf,
               "soft_labels": soft, "captions": None}
        yield row, Record(path, "the file")


def run(inputs: list[Path], out: Path, *, overwrite: bool, source: str, split: str,
        domain: str | None, append: bool, feature_extractor: str, shard_mb: float,
        class_names: str | None, image_sizes: str | None,
        nominal_size: int | None) -> ImportReport:
    if (image_sizes is None) == (nominal_size is None):
        raise ValueError("uniter-npz: norm_bb boxes are normalised, so give exactly one of "
                         "--image-sizes FILE (real sizes; needed to compare with pixel boxes "
                         "such as RefCOCO targets) or --nominal-size S (an S×S canvas; keeps "
                         "normalised coordinates, loses the aspect ratio)")
    if nominal_size is not None and nominal_size <= 0:
        raise ValueError(f"--nominal-size must be positive, got {nominal_size}")
    sizes = load_image_sizes(Path(image_sizes)) if image_sizes else None
    files = npz_files(inputs)
    meta = {"image_size": f"from {Path(image_sizes).name}" if image_sizes
            else f"nominal {nominal_size}x{nominal_size} canvas (aspect ratio unknown)"}
    options = {"source": source, "split": split, "domain": domain,
               "feature_extractor": feature_extractor, "image_sizes": image_sizes,
               "nominal_size": nominal_size}
    return write_features("uniter-npz", _rows(files, source, split, sizes, nominal_size), inputs,
                          out, source=source, split=split, domain=domain, overwrite=overwrite,
                          feature_extractor=feature_extractor, shard_mb=shard_mb,
                          extra_meta=meta, options=options, class_names_file=class_names,
                          append=append)


register(Importer(
    name="uniter-npz", kind="features",
    summary="UNITER per-image .npz feature dumps → image shards",
    inputs=".npz files and/or folders of them (the file name is the image id)",
    description="One .npz per image with features (N×D), norm_bb (N×6 or N×7 normalised "
                "x1,y1,x2,y2,w,h[,w·h]), conf (N) and optional soft_labels (N×C). Boxes are "
                "normalised, so pass --image-sizes (real sizes) or --nominal-size (square "
                "canvas; aspect ratio lost). Loaded without pickle. Writes OUT/images/SOURCE/.",
    run=run,
    options=(SOURCE, SPLIT, DOMAIN, APPEND, extractor_option(DEFAULT_EXTRACTOR), SHARD_MB,
             CLASS_NAMES,
             Option("--image-sizes", "JSON with the real image sizes: COCO instances/"
                                     "image_info (images[].id/width/height), VG image_data.json, "
                                     "or {image_id: [width, height]}"),
             Option("--nominal-size", "store boxes on an S×S canvas instead of real sizes",
                    type=int))))
