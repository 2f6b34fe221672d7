"""The shard format's constants: the image shard schema, the splits, the metadata prefix, the
error every violation raises and what a shard's metadata says (see ``shards`` for the format)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping

import pyarrow as pa

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
