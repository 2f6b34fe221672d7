"""Streaming writer of image shards: checks each input record, cuts files by size.

Public feature dumps are tens of gigabytes, so rows are buffered only up to a target shard
size. Every record is checked here, where the input file and line are still known, so a bad
box or a NaN feature is reported as ``file: line 12, field 'boxes': ...`` rather than as a
row of a shard the user never wrote.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from vlp.datasets.importers.import_error import InputFormatError
from vlp.datasets.storage.shards import image_table, write_image_shard
from vlp.datasets.storage.shard_format import BOX_TOLERANCE, SPLITS, ShardError, ShardInfo

FP16_MAX = 65504.0  # features are stored as fp16: larger magnitudes would become Inf


@dataclass
class Record:
    """Where a row came from: the input file and its record label (e.g. ``line 12``)."""
    path: Path
    label: str

    def error(self, problem: str, field_name: str | None = None) -> InputFormatError:
        label = self.label + (f", field '{field_name}'" if field_name else "")
        return InputFormatError(self.path, problem, label)


@dataclass
class ImageShardWriter:
    folder: Path
    feature_extractor: str
    prefix: str                     # file names <prefix>-00000.parquet (the split)
    extra_meta: Mapping[str, Any] = field(default_factory=dict)
    target_bytes: int = 128 << 20
    start: int = 0                  # number of the first file (appending to a folder)
    feature_dim: int | None = None
    num_classes: int | None = None
    written: list[ShardInfo] = field(default_factory=list)
    _rows: list[dict] = field(default_factory=list)
    _records: list[Record] = field(default_factory=list)
    _bytes: int = 0
    seen: dict[str, Record] = field(default_factory=dict)  # image id → first record

    def add(self, row: dict, record: Record) -> None:
        image_id = str(row["image_id"])
        if image_id in self.seen:
            first = self.seen[image_id]
            raise record.error(f"image id {image_id!r} appears twice (first at {first.path}: "
                               f"{first.label})")
        self._check(row, record)
        self.seen[image_id] = record
        self._rows.append(row)
        self._records.append(record)
        self._bytes += row["features"].size * 2 + (0 if row.get("soft_labels") is None
                                                   else row["soft_labels"].size * 2)
        if self._bytes >= self.target_bytes:
            self._flush()

    @property
    def num_images(self) -> int:
        return len(self.seen)

    def close(self) -> list[ShardInfo]:
        if self._rows:
            self._flush()
        return self.written

    # ------------------------------------------------------------------ checks

    def _check(self, row: dict, record: Record) -> None:
        w, h = int(row["width"]), int(row["height"])
        if w <= 0 or h <= 0:
            raise record.error(f"image size {w}x{h}, expected positive", "width")
        if row["split"] not in SPLITS:
            raise record.error(f"split {row['split']!r}, expected one of {SPLITS}")
        feats = row["features"]
        if feats.ndim != 2 or feats.shape[0] < 1:
            raise record.error(f"features of shape {feats.shape}, expected num_boxes × D with "
                               f"at least one region", "features")
        n, dim = feats.shape
        if self.feature_dim is None:
            self.feature_dim = dim
        elif dim != self.feature_dim:
            raise record.error(f"{dim}-d features, but earlier records were "
                               f"{self.feature_dim}-d", "features")
        bad = ~np.isfinite(feats) | (np.abs(feats) > FP16_MAX)
        if bad.any():
            box, col = map(int, np.argwhere(bad)[0])
            raise record.error(f"region {box}, value {col} is {float(feats[box, col])}: NaN/Inf or "
                               f"beyond the fp16 range the shards store", "features")
        boxes = row["boxes"]
        if boxes.shape != (n, 4):
            raise record.error(f"boxes of shape {boxes.shape}, expected ({n}, 4)", "boxes")
        bad = (~np.isfinite(boxes).all(1) | (boxes[:, 0] < -BOX_TOLERANCE)
               | (boxes[:, 1] < -BOX_TOLERANCE) | (boxes[:, 2] > w + BOX_TOLERANCE)
               | (boxes[:, 3] > h + BOX_TOLERANCE) | (boxes[:, 2] < boxes[:, 0])
               | (boxes[:, 3] < boxes[:, 1]))
        if bad.any():
            k = int(np.flatnonzero(bad)[0])
            raise record.error(f"box {k} = {boxes[k].tolist()} (x1, y1, x2, y2) lies outside "
                               f"the {w}x{h} image or has x2 < x1 / y2 < y1", "boxes")
        conf = row["confidences"]
        if conf.shape != (n,):
            raise record.error(f"{conf.size} confidences, expected {n}", "confidences")
        bad = ~np.isfinite(conf) | (conf < 0) | (conf > 1)
        if bad.any():
            k = int(np.flatnonzero(bad)[0])
            raise record.error(f"confidence {k} is {float(conf[k])}, expected [0, 1]",
                               "confidences")
        soft = row.get("soft_labels")
        if soft is not None:
            if soft.ndim != 2 or soft.shape[0] != n:
                raise record.error(f"soft labels of shape {soft.shape}, expected ({n}, C)",
                                   "soft_labels")
            if self.num_classes is None:
                self.num_classes = int(soft.shape[1])
            elif soft.shape[1] != self.num_classes:
                raise record.error(f"soft labels over {soft.shape[1]} classes, but earlier "
                                   f"records had {self.num_classes}", "soft_labels")
            if not np.isfinite(soft).all():
                raise record.error("NaN or Inf in the soft labels", "soft_labels")

    # ------------------------------------------------------------------ output

    def _flush(self) -> None:
        path = self.folder / f"{self.prefix}-{self.start + len(self.written):05d}.parquet"
        table = image_table(self._rows, self.feature_dim, self.num_classes)
        try:
            info = write_image_shard(path, table, feature_extractor=self.feature_extractor,
                                     feature_dim=self.feature_dim,
                                     num_classes=self.num_classes, extra_meta=self.extra_meta)
        except ShardError as e:  # a check above missed something: still name the input
            if e.row is None:
                raise
            raise self._records[e.row].error(e.problem, e.field) from None
        self.written.append(info)
        self._rows, self._records, self._bytes = [], [], 0
