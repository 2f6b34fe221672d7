"""The Parquet shard format: image shards and task tables, a writer and a validating reader.

An *image shard* holds one row per image: detector output (boxes, confidences, region
features, optional soft class labels), optional encoded pixels and the image's captions.
Region features are stored as raw little-endian fp16 bytes (``num_boxes × feature_dim``) so a
shard of any feature width D is one binary column that Arrow reads without copying; the width
D and the class count C live in the file's key-value metadata together with the name of the
feature extractor that produced them and a content hash of the rows (users of the reference
code lose track of which extractor made a feature store).

Task tables (one downstream benchmark split each) are in ``task_tables``; they share this
module's metadata, content hash and :class:`ShardError`.

Every write goes to a temporary name in the target folder and is renamed when complete, so
an interrupted job never leaves a file that looks finished. Every violation raises one
:class:`ShardError` naming the file, the row and the field.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from vlp.contract.atomic_write import atomic_path
from vlp.contract.uri_files import UriError, filesystem, is_uri, kind, location, open_input
from vlp.datasets.storage.shard_checks import validate_image_table
from vlp.datasets.storage.shard_format import (BOX_TOLERANCE, FORMAT_VERSION, IMAGE_REQUIRED,
                                               IMAGE_SCHEMA, META_PREFIX, ShardError, ShardInfo)

# --------------------------------------------------------------------------- writing

def _atomic_write_table(table: pa.Table, path: Path) -> None:
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp, compression="zstd", use_dictionary=["source", "split"]
                       if "source" in table.column_names else True,
                       write_statistics=True)


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

def read_image_shard(path: str | os.PathLike, *, validate: bool = True,
                     check_values: bool = True, columns: list[str] | None = None
                     ) -> tuple[pa.Table, ShardInfo]:
    """Read an image shard (a local path or a URI); with ``validate`` every row is checked and
    errors name the row."""
    path = location(path)
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


def _read_parquet(path: Path | str, columns: list[str] | None) -> pa.Table:
    """``path`` (a local ``Path`` or a URI string) as a table; errors name the file."""
    try:
        there = kind(path) is not None
    except (UriError, OSError) as e:
        raise ShardError(path, f"cannot read it ({str(e).splitlines()[0]})") from None
    if not there:
        raise ShardError(path, "no such file")
    try:
        return pq.read_table(open_input(path), columns=columns)
    except (pa.ArrowInvalid, pa.ArrowIOError, OSError) as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ShardError(path, f"not a readable Parquet file (truncated or corrupt?): {first}"
                         ) from None
    except (KeyError, ValueError) as e:  # a requested column that does not exist
        raise ShardError(path, f"cannot read columns {columns}: {e}") from None


def shard_info(path: str | os.PathLike, schema: pa.Schema | None = None,
               num_rows: int | None = None) -> ShardInfo:
    """Metadata of a shard (reads only the footer when schema is not given)."""
    path = location(path)
    if schema is None:
        try:
            pf = pq.ParquetFile(open_input(path))
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


# --------------------------------------------------------------------------- a data folder

def list_shards(folder: str | os.PathLike) -> list[Path] | list[str]:
    """The finished Parquet files under ``folder`` (temporary names are skipped), sorted: paths
    for a local folder, URIs for a folder given by URI (``s3://bucket/world/images/coco``)."""
    if is_uri(folder):
        return _list_shards_at(str(folder).rstrip("/"))
    folder = Path(folder)
    if not folder.is_dir():
        raise ShardError(folder, "no such folder")
    # hidden names are temporary files and staging folders of writes still in progress
    files = sorted(p for p in folder.rglob("*.parquet")
                   if not any(part.startswith(".") for part in p.relative_to(folder).parts))
    return files


def _list_shards_at(uri: str) -> list[str]:
    """``list_shards`` of a folder in object storage (``vlp.contract.uri_files``)."""
    import posixpath

    import pyarrow.fs as pafs

    try:
        fs, root = filesystem(uri)
        is_dir = fs.get_file_info(root).type == pafs.FileType.Directory
    except (UriError, OSError) as e:
        raise ShardError(uri, f"cannot read it ({str(e).splitlines()[0]})") from None
    if not is_dir:
        raise ShardError(uri, "no such folder")
    found = []
    for info in fs.get_file_info(pafs.FileSelector(root, recursive=True)):
        rel = posixpath.relpath(info.path, root)
        if (info.type == pafs.FileType.File and rel.endswith(".parquet")
                and not any(part.startswith(".") for part in rel.split("/"))):
            found.append(f"{uri}/{rel}")
    return sorted(found)
