"""The validating reader's checks of an image shard: required columns, splits, box and feature
lengths, box coordinates inside the image, finite values. Each violation is one
:class:`~vlp.datasets.storage.shard_format.ShardError` naming file, row and field."""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from vlp.datasets.storage.shard_format import (BOX_TOLERANCE, IMAGE_REQUIRED, IMAGE_SCHEMA, SPLITS,
                                               ShardError)


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
