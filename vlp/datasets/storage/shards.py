"""The Parquet shard format: image shards and task tables, a writer and a validating reader.

An *image shard* holds one row per image: detector output (boxes, confidences, region
features, optional soft class labels), optional encoded pixels and the image's captions.
Region features are stored as raw little-endian fp16 bytes (``num_boxes × feature_dim``) so a
shard of any feature width D is one binary column that Arrow reads without copying; the width
D and the class count C live in the file's key-value metadata together with the name of the
feature extractor that produced them and a content hash of the rows (users of the reference
code lose track of which extractor made a feature store).

A *task table* holds the rows of one downstream benchmark split (vqa, retrieval, nlvr2, ve,
refexp, vcr) and points at images by ``image_id``.

Every write goes to a temporary name in the target folder and is renamed when complete, so
an interrupted job never leaves a file that looks finished. Every violation raises one
:class:`ShardError` naming the file, the row and the field.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

FORMAT_VERSION = "1"
META_PREFIX = "vlp."
BOX_TOLERANCE = 1.0  # pixels: detectors round box corners, allow one pixel outside the image


class ShardError(ValueError):
    """A shard or task table violates the format. The message names file, row and field."""

    def __init__(self, path: str | os.PathLike, problem: str, row: int | None = None,
                 field: str | None = None):
        self.path, self.row, self.field, self.problem = str(path), row, field, problem
        where = str(path)
        if row is not None:
            where += f": row {row}"
        if field is not None:
            where += f", field '{field}'" if row is not None else f": field '{field}'"
        super().__init__(f"{where}: {problem}")


# --------------------------------------------------------------------------- schemas

IMAGE_SCHEMA = pa.schema([
    pa.field("image_id", pa.string(), nullable=False),
    pa.field("source", pa.string(), nullable=False),
    pa.field("split", pa.string(), nullable=False),
    pa.field("width", pa.int32(), nullable=False),
    pa.field("height", pa.int32(), nullable=False),
    pa.field("num_boxes", pa.int32(), nullable=False),
    pa.field("boxes", pa.list_(pa.float32()), nullable=False),        # 4·N: x1,y1,x2,y2 pixels
    pa.field("confidences", pa.list_(pa.float32()), nullable=False),  # N detector confidences
    pa.field("features", pa.binary(), nullable=False),                # N·D fp16 little-endian
    pa.field("soft_labels", pa.binary(), nullable=True),              # N·C fp16, optional
    pa.field("pixels", pa.binary(), nullable=True),                   # PNG/JPEG bytes, optional
    pa.field("captions", pa.list_(pa.string()), nullable=True),       # null = image has none
    # D fp16: the feature of an RoI covering the whole image (VL-BERT's visual input of its
    # text tokens), kept apart from the detected regions so no family's regions change
    pa.field("image_feature", pa.binary(), nullable=True),
])
IMAGE_REQUIRED = ["image_id", "source", "split", "width", "height", "num_boxes", "boxes",
                  "confidences", "features"]

SPLITS = ("train", "val", "test")

_S, _I, _F, _B = pa.string(), pa.int32(), pa.float32(), pa.bool_()
TASK_SCHEMAS: dict[str, pa.Schema] = {
    # VQA v2: 10 raw annotator answers per question; the answer vocabulary is built later.
    "vqa": pa.schema([("question_id", _S), ("image_id", _S), ("question", _S),
                      ("answers", pa.list_(_S))]),
    # Flickr30K-style retrieval: one row per (image, caption); 5 captions per image.
    "retrieval": pa.schema([("caption_id", _S), ("image_id", _S), ("caption", _S)]),
    # NLVR2: one statement about two images, true/false.
    "nlvr2": pa.schema([("id", _S), ("image_id_left", _S), ("image_id_right", _S),
                        ("statement", _S), ("label", _B)]),
    # SNLI-VE: image premise, text hypothesis.
    "ve": pa.schema([("id", _S), ("image_id", _S), ("hypothesis", _S), ("label", _S)]),
    # RefCOCO+: expression → target box; gt_boxes are the annotated objects of the image
    # (the "ground-truth boxes" setting); the detected setting uses the image shard's boxes.
    "refexp": pa.schema([("ref_id", _S), ("image_id", _S), ("expression", _S),
                         ("target_box", pa.list_(_F)), ("gt_boxes", pa.list_(_F)),
                         ("target_gt_index", _I)]),
    # VCR: question, 4 answers, 4 rationales, the right index of each.
    "vcr": pa.schema([("id", _S), ("image_id", _S), ("question", _S),
                      ("answers", pa.list_(_S)), ("answer_label", _I),
                      ("rationales", pa.list_(_S)), ("rationale_label", _I)]),
}
VE_LABELS = ("entailment", "neutral", "contradiction")


@dataclass(frozen=True)
class ShardInfo:
    """What a shard's metadata says about it."""
    path: str
    kind: str                 # "images" or "task:<name>"
    num_rows: int
    feature_extractor: str | None = None
    feature_dim: int | None = None
    num_classes: int | None = None
    content_hash: str | None = None
    extra: Mapping[str, str] | None = None


# --------------------------------------------------------------------------- atomic write

def _atomic_write_table(table: pa.Table, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        pq.write_table(table, tmp, compression="zstd", use_dictionary=["source", "split"]
                       if "source" in table.column_names else True,
                       write_statistics=True)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def content_hash(table: pa.Table) -> str:
    """sha256 over the rows (Arrow IPC bytes of the data, schema metadata excluded)."""
    # canonical form: nullable fields, no metadata, one chunk — so that a Parquet round trip
    # (which may change nullability flags and chunking) hashes the same rows identically
    def plain(t: pa.DataType) -> pa.DataType:  # list child names differ after Parquet
        return pa.list_(plain(t.value_type)) if pa.types.is_list(t) else t
    canonical = pa.schema([pa.field(f.name, plain(f.type)) for f in table.schema])
    # IPC writes a slice's buffers with other sizes than the same rows read back from
    # Parquet: copy the rows into fresh buffers so that equal rows hash equally
    table = table.cast(canonical).take(pa.array(np.arange(table.num_rows)))
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        for batch in table.combine_chunks().to_batches():
            writer.write_batch(batch)
    return hashlib.sha256(sink.getvalue().to_pybytes()).hexdigest()


def _with_meta(table: pa.Table, meta: Mapping[str, Any]) -> pa.Table:
    kv = {f"{META_PREFIX}{k}".encode(): str(v).encode() for k, v in meta.items() if v is not None}
    return table.replace_schema_metadata(kv)


def _meta(schema: pa.Schema) -> dict[str, str]:
    raw = schema.metadata or {}
    return {k.decode()[len(META_PREFIX):]: v.decode() for k, v in raw.items()
            if k.decode().startswith(META_PREFIX)}


# --------------------------------------------------------------------------- image shards

def image_table(rows: Iterable[Mapping[str, Any]], feature_dim: int,
                num_classes: int | None = None) -> pa.Table:
    """Build an image table from python rows.

    Each row: image_id, source, split, width, height, boxes (N×4 array-like, pixels),
    confidences (N), features (N×D array, stored as fp16), optional soft_labels (N×C),
    optional pixels (encoded bytes), captions (list of str, or None), optional
    image_feature (D: the whole-image RoI's feature). Without one, a detected box that covers
    the whole image (within ``BOX_TOLERANCE``) lends its feature: an importer whose detector
    output has a full-image box keeps it (the box stays a region too).
    """
    cols: dict[str, list] = {f.name: [] for f in IMAGE_SCHEMA}
    for r in rows:
        boxes = np.asarray(r["boxes"], dtype=np.float32).reshape(-1, 4)
        n = boxes.shape[0]
        feats = np.asarray(r["features"])
        cols["image_id"].append(str(r["image_id"]))
        cols["source"].append(r["source"])
        cols["split"].append(r["split"])
        cols["width"].append(int(r["width"]))
        cols["height"].append(int(r["height"]))
        cols["num_boxes"].append(n)
        cols["boxes"].append(boxes.reshape(-1))
        cols["confidences"].append(np.asarray(r["confidences"], dtype=np.float32).reshape(-1))
        cols["features"].append(feats.astype("<f2").tobytes())
        soft = r.get("soft_labels")
        cols["soft_labels"].append(None if soft is None
                                   else np.asarray(soft).astype("<f2").tobytes())
        cols["pixels"].append(r.get("pixels"))
        caps = r.get("captions")
        cols["captions"].append(None if caps is None else list(caps))
        whole = r.get("image_feature")
        if whole is None:
            k = full_image_box(boxes, int(r["width"]), int(r["height"]))
            whole = None if k is None else feats.reshape(n, -1)[k]
        cols["image_feature"].append(None if whole is None
                                     else np.asarray(whole).astype("<f2").tobytes())
    return pa.Table.from_pydict(cols, schema=IMAGE_SCHEMA)


def full_image_box(boxes: np.ndarray, width: int, height: int) -> int | None:
    """Index of the first box covering the whole ``width`` × ``height`` image, or None."""
    t = BOX_TOLERANCE
    whole = ((boxes[:, 0] <= t) & (boxes[:, 1] <= t) & (boxes[:, 2] >= width - t)
             & (boxes[:, 3] >= height - t))
    hits = np.flatnonzero(whole)
    return int(hits[0]) if hits.size else None


def write_image_shard(path: str | os.PathLike, table: pa.Table, *, feature_extractor: str,
                      feature_dim: int, num_classes: int | None = None,
                      extra_meta: Mapping[str, Any] | None = None) -> ShardInfo:
    """Validate ``table`` and write it atomically to ``path`` with its metadata."""
    path = Path(path)
    if not feature_extractor:
        raise ShardError(path, "feature_extractor must name the extractor that made the features")
    missing = [c for c in IMAGE_REQUIRED if c not in table.column_names]
    if missing:  # (select() below would raise a bare KeyError that names no file)
        raise ShardError(path, f"missing required column(s) {missing}; an image shard needs "
                               f"{IMAGE_REQUIRED}", field=missing[0])
    for f in IMAGE_SCHEMA:  # optional columns left out are stored as nulls
        if f.name not in table.column_names:
            table = table.append_column(f.name, pa.nulls(table.num_rows, f.type))
    table = table.select([f.name for f in IMAGE_SCHEMA]).cast(IMAGE_SCHEMA)
    validate_image_table(table, path, feature_dim, num_classes)
    digest = content_hash(table)
    meta = {"format_version": FORMAT_VERSION, "kind": "images",
            "feature_extractor": feature_extractor, "feature_dim": feature_dim,
            "num_classes": num_classes, "content_hash": digest, **(extra_meta or {})}
    _atomic_write_table(_with_meta(table, meta), path)
    return ShardInfo(str(path), "images", table.num_rows, feature_extractor, feature_dim,
                     num_classes, digest, dict(extra_meta or {}))


def _first_bad(mask: pa.ChunkedArray | pa.Array | np.ndarray) -> int | None:
    arr = np.asarray(mask.to_numpy(zero_copy_only=False) if hasattr(mask, "to_numpy") else mask)
    bad = np.flatnonzero(arr)
    return int(bad[0]) if bad.size else None


def validate_image_table(table: pa.Table, path: str | os.PathLike, feature_dim: int,
                         num_classes: int | None, check_values: bool = True) -> None:
    """Raise ShardError on the first violation; vectorised, then exact per-row where needed."""
    missing = [c for c in IMAGE_REQUIRED if c not in table.column_names]
    if missing:
        raise ShardError(path, f"missing required column(s) {missing}; an image shard needs "
                               f"{IMAGE_REQUIRED}", field=missing[0])
    for f in IMAGE_SCHEMA:
        if f.name in table.column_names and not table.schema.field(f.name).type.equals(f.type):
            raise ShardError(path, f"type {table.schema.field(f.name).type}, expected {f.type}",
                             field=f.name)
    if feature_dim is None or int(feature_dim) <= 0:
        raise ShardError(path, f"feature_dim must be a positive integer, got {feature_dim!r}")
    for name in IMAGE_REQUIRED:
        row = _first_bad(table.column(name).is_null())
        if row is not None:
            raise ShardError(path, "null in a required column", row, name)

    n = table.column("num_boxes").to_numpy()
    row = _first_bad(n < 1)
    if row is not None:
        raise ShardError(path, f"num_boxes={n[row]}, expected at least 1 region", row, "num_boxes")
    split = table.column("split")
    row = _first_bad(pc.invert(pc.is_in(split, pa.array(SPLITS))))
    if row is not None:
        raise ShardError(path, f"split {split[row].as_py()!r}, expected one of {SPLITS}", row,
                         "split")
    w = table.column("width").to_numpy()
    h = table.column("height").to_numpy()
    row = _first_bad((w <= 0) | (h <= 0))
    if row is not None:
        raise ShardError(path, f"image size {w[row]}x{h[row]}, expected positive", row, "width")

    nbox = pc.list_value_length(table.column("boxes")).to_numpy(zero_copy_only=False)
    row = _first_bad(nbox != 4 * n)
    if row is not None:
        raise ShardError(path, f"{nbox[row]} box values, expected 4 × num_boxes = {4 * n[row]}",
                         row, "boxes")
    nconf = pc.list_value_length(table.column("confidences")).to_numpy(zero_copy_only=False)
    row = _first_bad(nconf != n)
    if row is not None:
        raise ShardError(path, f"{nconf[row]} confidences, expected num_boxes = {n[row]}", row,
                         "confidences")
    flen = pc.binary_length(table.column("features")).to_numpy(zero_copy_only=False)
    expect = n.astype(np.int64) * int(feature_dim) * 2
    row = _first_bad(flen != expect)
    if row is not None:
        raise ShardError(path, f"{flen[row]} bytes, expected num_boxes × feature_dim × 2 "
                               f"(fp16) = {n[row]} × {feature_dim} × 2 = {expect[row]}",
                         row, "features")
    if "soft_labels" in table.column_names and table.column("soft_labels").null_count < len(table):
        if not num_classes:
            raise ShardError(path, "soft labels present but num_classes not declared",
                             field="soft_labels")
        slen = pc.binary_length(table.column("soft_labels")).to_numpy(zero_copy_only=False)
        valid = table.column("soft_labels").is_valid().to_numpy(zero_copy_only=False)
        expect_s = n.astype(np.int64) * int(num_classes) * 2
        row = _first_bad(valid & (np.nan_to_num(slen, nan=-1) != expect_s))
        if row is not None:
            raise ShardError(path, f"{slen[row]} bytes, expected num_boxes × num_classes × 2 = "
                                   f"{expect_s[row]}", row, "soft_labels")
    if "image_feature" in table.column_names:
        col = table.column("image_feature")
        ilen = pc.binary_length(col).to_numpy(zero_copy_only=False)
        valid = col.is_valid().to_numpy(zero_copy_only=False)
        row = _first_bad(valid & (np.nan_to_num(ilen, nan=-1) != int(feature_dim) * 2))
        if row is not None:
            raise ShardError(path, f"{ilen[row]} bytes, expected feature_dim × 2 (fp16) = "
                                   f"{int(feature_dim) * 2}", row, "image_feature")
    if "captions" in table.column_names:
        caps = table.column("captions")
        clen = pc.list_value_length(caps).to_numpy(zero_copy_only=False)
        row = _first_bad(caps.is_valid().to_numpy(zero_copy_only=False) & (clen == 0))
        if row is not None:
            raise ShardError(path, "empty caption list (use null for an image without captions)",
                             row, "captions")
        flat = pc.list_flatten(caps)
        if len(flat):
            empty = pc.or_(pc.is_null(flat), pc.equal(pc.utf8_length(pc.utf8_trim_whitespace(
                pc.fill_null(flat, ""))), 0))
            k = _first_bad(empty)
            if k is not None:
                owner = int(np.searchsorted(np.cumsum(np.nan_to_num(clen, nan=0)), k, side="right"))
                raise ShardError(path, "empty caption string", owner, "captions")
    if check_values:
        _validate_values(table, path, feature_dim, num_classes, n, w, h)


def _validate_values(table, path, feature_dim, num_classes, n, w, h) -> None:
    boxes = pc.list_flatten(table.column("boxes")).to_numpy(zero_copy_only=False).reshape(-1, 4)
    owner = np.repeat(np.arange(len(n)), n)
    ww, hh = w[owner].astype(np.float32), h[owner].astype(np.float32)
    bad = (~np.isfinite(boxes).all(1) | (boxes[:, 0] < -BOX_TOLERANCE)
           | (boxes[:, 1] < -BOX_TOLERANCE) | (boxes[:, 2] > ww + BOX_TOLERANCE)
           | (boxes[:, 3] > hh + BOX_TOLERANCE) | (boxes[:, 2] < boxes[:, 0])
           | (boxes[:, 3] < boxes[:, 1]))
    k = _first_bad(bad)
    if k is not None:
        r = int(owner[k])
        raise ShardError(path, f"box {k - int(n[:r].sum())} = {boxes[k].tolist()} lies outside "
                               f"the {w[r]}x{h[r]} image or has x2<x1 / y2<y1", r, "boxes")
    conf = pc.list_flatten(table.column("confidences")).to_numpy(zero_copy_only=False)
    k = _first_bad(~np.isfinite(conf) | (conf < 0) | (conf > 1))
    if k is not None:
        raise ShardError(path, f"confidence {conf[k]} outside [0, 1]", int(owner[k]),
                         "confidences")
    for col, width in (("features", feature_dim), ("soft_labels", num_classes),
                       ("image_feature", feature_dim)):
        if col in table.column_names and width:
            row = _nonfinite_row(table.column(col))
            if row is not None:
                raise ShardError(path, "NaN or Inf values", row, col)


def _nonfinite_row(column: pa.ChunkedArray) -> int | None:
    """First row whose fp16 blob holds a NaN/Inf; scans the Arrow data buffer without copies."""
    base = 0
    for chunk in column.chunks:
        if len(chunk) and chunk.buffers()[2] is not None:
            offsets = np.frombuffer(chunk.buffers()[1], dtype=np.int32)[
                chunk.offset:chunk.offset + len(chunk) + 1]
            data = np.frombuffer(chunk.buffers()[2], dtype=np.uint8)[offsets[0]:offsets[-1]]
            bad = np.flatnonzero(~np.isfinite(data.view("<f2")))
            if bad.size:
                byte = int(bad[0]) * 2 + int(offsets[0])
                return base + int(np.searchsorted(offsets, byte, side="right")) - 1
        base += len(chunk)
    return None


def read_image_shard(path: str | os.PathLike, *, validate: bool = True,
                     check_values: bool = True, columns: list[str] | None = None
                     ) -> tuple[pa.Table, ShardInfo]:
    """Read an image shard; with ``validate`` every row is checked and errors name the row."""
    path = Path(path)
    table = _read_parquet(path, columns)
    info = shard_info(path, table.schema, table.num_rows)
    if info.kind != "images":
        raise ShardError(path, f"kind {info.kind!r}, expected an image shard ('images')")
    if info.feature_dim is None:
        raise ShardError(path, "metadata lacks vlp.feature_dim")
    if validate:
        validate_image_table(table, path, info.feature_dim, info.num_classes,
                             check_values=check_values)
        if columns is None and info.content_hash and content_hash(
                table.replace_schema_metadata(None)) != info.content_hash:
            raise ShardError(path, "content hash does not match the metadata: the rows were "
                                   "changed after the shard was written")
    return table, info


def _read_parquet(path: Path, columns: list[str] | None) -> pa.Table:
    if not path.exists():
        raise ShardError(path, "no such file")
    try:
        return pq.read_table(path, columns=columns)
    except (pa.ArrowInvalid, pa.ArrowIOError, OSError) as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ShardError(path, f"not a readable Parquet file (truncated or corrupt?): {first}"
                         ) from None
    except (KeyError, ValueError) as e:  # a requested column that does not exist
        raise ShardError(path, f"cannot read columns {columns}: {e}") from None


def shard_info(path: str | os.PathLike, schema: pa.Schema | None = None,
               num_rows: int | None = None) -> ShardInfo:
    """Metadata of a shard (reads only the footer when schema is not given)."""
    path = Path(path)
    if schema is None:
        try:
            pf = pq.ParquetFile(path)
        except (pa.ArrowInvalid, OSError) as e:
            raise ShardError(path, f"not a readable Parquet file (truncated or corrupt?): "
                                   f"{str(e).splitlines()[0]}") from None
        schema, num_rows = pf.schema_arrow, pf.metadata.num_rows
    m = _meta(schema)
    known = {"format_version", "kind", "feature_extractor", "feature_dim", "num_classes",
             "content_hash"}
    return ShardInfo(str(path), m.get("kind", "unknown"), int(num_rows or 0),
                     m.get("feature_extractor"),
                     int(m["feature_dim"]) if m.get("feature_dim") else None,
                     int(m["num_classes"]) if m.get("num_classes") else None,
                     m.get("content_hash"), {k: v for k, v in m.items() if k not in known})


def decode_features(blob: bytes, dim: int) -> np.ndarray:
    """fp16 bytes → (N, dim) float16 array (zero-copy view)."""
    return np.frombuffer(blob, dtype="<f2").reshape(-1, dim)


# --------------------------------------------------------------------------- task tables

def write_task_table(path: str | os.PathLike, task: str, table: pa.Table | Mapping[str, list],
                     extra_meta: Mapping[str, Any] | None = None) -> ShardInfo:
    path = Path(path)
    if task not in TASK_SCHEMAS:
        raise ShardError(path, f"unknown task {task!r}; known: {sorted(TASK_SCHEMAS)}")
    schema = TASK_SCHEMAS[task]
    if not isinstance(table, pa.Table):
        missing = [n for n in schema.names if n not in table]
        if missing:  # (from_pydict would raise a bare KeyError that names no file)
            raise ShardError(path, f"missing required column(s) {missing}", field=missing[0])
        table = pa.Table.from_pydict(dict(table), schema=schema)
    table = _conform(table, schema, path)
    validate_task_table(table, task, path)
    digest = content_hash(table)
    meta = {"format_version": FORMAT_VERSION, "kind": f"task:{task}", "content_hash": digest,
            **(extra_meta or {})}
    _atomic_write_table(_with_meta(table, meta), path)
    return ShardInfo(str(path), f"task:{task}", table.num_rows, content_hash=digest,
                     extra=dict(extra_meta or {}))


def _conform(table: pa.Table, schema: pa.Schema, path) -> pa.Table:
    missing = [f.name for f in schema if f.name not in table.column_names]
    if missing:
        raise ShardError(path, f"missing required column(s) {missing}", field=missing[0])
    try:
        return table.select(schema.names).cast(schema)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
        raise ShardError(path, f"columns do not match the schema {schema}: {e}") from None


def validate_task_table(table: pa.Table, task: str, path) -> None:
    schema = TASK_SCHEMAS[task]
    for name in schema.names:
        row = _first_bad(table.column(name).is_null())
        if row is not None:
            raise ShardError(path, "null value", row, name)
    for name in schema.names:
        if schema.field(name).type == pa.string():
            row = _first_bad(pc.equal(pc.utf8_length(table.column(name)), 0))
            if row is not None:
                raise ShardError(path, "empty string", row, name)
    if task == "vqa":
        row = _first_bad(pc.equal(pc.list_value_length(table.column("answers")), 0))
        if row is not None:
            raise ShardError(path, "no annotator answers", row, "answers")
    elif task == "ve":
        row = _first_bad(pc.invert(pc.is_in(table.column("label"), pa.array(VE_LABELS))))
        if row is not None:
            raise ShardError(path, f"label {table.column('label')[row].as_py()!r}, expected one "
                                   f"of {VE_LABELS}", row, "label")
    elif task == "refexp":
        for col in ("target_box", "gt_boxes"):
            lens = pc.list_value_length(table.column(col)).to_numpy(zero_copy_only=False)
            row = _first_bad((lens % 4 != 0) | (lens == 0) | ((lens != 4) if col == "target_box"
                                                               else False))
            if row is not None:
                raise ShardError(path, f"{lens[row]} values, expected "
                                       f"{'4' if col == 'target_box' else 'a multiple of 4'}",
                                 row, col)
        ngt = pc.list_value_length(table.column("gt_boxes")).to_numpy(zero_copy_only=False) // 4
        idx = table.column("target_gt_index").to_numpy()
        row = _first_bad((idx < 0) | (idx >= ngt))
        if row is not None:
            raise ShardError(path, f"index {idx[row]} outside the {ngt[row]} gt boxes", row,
                             "target_gt_index")
    elif task == "vcr":
        for lst, lab in (("answers", "answer_label"), ("rationales", "rationale_label")):
            lens = pc.list_value_length(table.column(lst)).to_numpy(zero_copy_only=False)
            labels = table.column(lab).to_numpy()
            row = _first_bad((labels < 0) | (labels >= lens))
            if row is not None:
                raise ShardError(path, f"label {labels[row]} outside the {lens[row]} choices",
                                 row, lab)


def read_task_table(path: str | os.PathLike, task: str | None = None, *,
                    validate: bool = True) -> tuple[pa.Table, ShardInfo]:
    path = Path(path)
    table = _read_parquet(path, None)
    info = shard_info(path, table.schema, table.num_rows)
    kind = info.kind.removeprefix("task:")
    if not info.kind.startswith("task:") or kind not in TASK_SCHEMAS:
        raise ShardError(path, f"kind {info.kind!r}, expected a task table")
    if task is not None and kind != task:
        raise ShardError(path, f"holds task {kind!r}, expected {task!r}")
    if validate:
        _conform(table, TASK_SCHEMAS[kind], path)
        validate_task_table(table.cast(TASK_SCHEMAS[kind].with_metadata(table.schema.metadata)),
                            kind, path)
    return table, info


# --------------------------------------------------------------------------- a data folder

def list_shards(folder: str | os.PathLike) -> list[Path]:
    """The finished Parquet files under ``folder`` (temporary names are skipped), sorted."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ShardError(folder, "no such folder")
    # hidden names are temporary files and staging folders of writes still in progress
    files = sorted(p for p in folder.rglob("*.parquet")
                   if not any(part.startswith(".") for part in p.relative_to(folder).parts))
    return files


def write_json_atomic(path: str | os.PathLike, obj: Any) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    with os.fdopen(fd, "w") as f:
        json.dump(obj, f, indent=2, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)
