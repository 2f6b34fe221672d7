"""``ImageBlock``: numpy views over one Arrow table of transformed image rows (zero copy).

The worker's batcher keeps a few blocks alive in its window and refers to examples as
(block, row, caption); the collate gathers from these views.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Mapping

import numpy as np
import pyarrow as pa

from vlp.datasets.storage.arrow_views import binary_parts, flat_numpy, list_parts, ranges


def image_key(image_id: str) -> int:
    """A stable 63-bit identity of an image id (the same in every process, unlike hash())."""
    return int.from_bytes(hashlib.blake2b(image_id.encode(), digest_size=8).digest(),
                          "little") >> 1


def image_keys(image_ids: list[str]) -> np.ndarray:
    return np.fromiter((image_key(i) for i in image_ids), dtype=np.int64, count=len(image_ids))


@dataclass
class ImageBlock:
    table: pa.Table | None       # keeps the Arrow buffers alive (None: a gathered copy)
    image_key: np.ndarray        # int64 [I]: image_key(image_id), equal ids → equal keys
    source_index: np.ndarray     # int64 [I]
    cap_start: np.ndarray        # int64 [I+1]: captions of image i are cap_start[i]:[i+1]
    tok_start: np.ndarray        # int64 [captions+1]: word pieces of caption g
    tokens: np.ndarray           # int32 [all word pieces]
    n_overlong: int
    n_truncated: int
    # regions
    num_regions: np.ndarray | None = None   # int64 [I]
    region_start: np.ndarray | None = None  # int64 [I+1]
    features: np.ndarray | None = None      # fp16 [regions, D]
    region_loc: np.ndarray | None = None    # float32 [regions, L]
    soft_labels: np.ndarray | None = None   # fp16 [regions, C]
    n_fallback: int = 0
    image_feature: np.ndarray | None = None  # fp16 [I, D] the whole-image RoI (VL-BERT)
    has_image_feature: np.ndarray | None = None   # bool [I] (a null entry: no such RoI)
    # pixels
    pixel_start: np.ndarray | None = None   # int64 [I+1] byte offsets into pixel_data
    pixel_data: np.ndarray | None = None    # uint8
    pixel_hw: np.ndarray | None = None      # int64 [I, 2]

    @property
    def num_images(self) -> int:
        return len(self.image_key)

    def num_captions(self) -> np.ndarray:
        return np.diff(self.cap_start)

    def text_lengths(self) -> np.ndarray:
        """Word pieces per caption (without [CLS]/[SEP])."""
        return np.diff(self.tok_start)

    def image(self, row: int) -> np.ndarray:
        h, w = self.pixel_hw[row]
        return self.pixel_data[self.pixel_start[row]:self.pixel_start[row + 1]].reshape(h, w, 3)

    @classmethod
    def from_table(cls, table: pa.Table, feature_dim: int, num_classes: int | None,
                   loc_dim: int) -> "ImageBlock":
        cap_start, caps = list_parts(table.column("caption_ids"))
        tok_start, tokens = list_parts(caps)
        names = table.column_names
        keys = (table.column("image_key").to_numpy() if "image_key" in names
                else image_keys(table.column("image_id").to_pylist()))
        block = cls(
            table=table,
            image_key=keys.astype(np.int64, copy=False),
            source_index=table.column("source_index").to_numpy().astype(np.int64),
            cap_start=cap_start, tok_start=tok_start, tokens=flat_numpy(tokens, np.int32),
            n_overlong=int(np.sum(table.column("n_overlong").to_numpy())),
            n_truncated=int(np.sum(table.column("n_truncated").to_numpy())))
        if "features" in names:
            n = table.column("num_regions").to_numpy().astype(np.int64)
            block.num_regions = n
            block.region_start = np.concatenate([[0], np.cumsum(n)]).astype(np.int64)
            _, data = binary_parts(table.column("features"))
            block.features = data.view("<f2").reshape(-1, feature_dim)
            _, loc = list_parts(table.column("region_loc"))
            block.region_loc = flat_numpy(loc, np.float32).reshape(-1, loc_dim)
            if "soft_labels" in names:
                _, soft = binary_parts(table.column("soft_labels"))
                block.soft_labels = soft.view("<f2").reshape(-1, num_classes)
            block.n_fallback = int(np.sum(table.column("region_fallback").to_numpy(
                zero_copy_only=False)))
            if "image_feature" in names:
                block.image_feature, block.has_image_feature = _whole_image(
                    table.column("image_feature"), feature_dim)
        if "pixels" in names:
            block.pixel_start, block.pixel_data = binary_parts(table.column("pixels"))
            block.pixel_hw = np.stack([table.column("pixel_h").to_numpy(),
                                       table.column("pixel_w").to_numpy()], 1).astype(np.int64)
        return block


def _whole_image(col, feature_dim: int) -> tuple[np.ndarray, np.ndarray]:
    """[I, D] fp16 (zeros where null) and the [I] validity of a nullable binary column."""
    start, data = binary_parts(col)
    has = np.diff(start) == feature_dim * 2
    out = np.zeros((len(has), feature_dim), np.float16)
    if has.any():
        rows = data.view("<f2")
        at = start[:-1][has] // 2
        out[has] = rows[at[:, None] + np.arange(feature_dim)]
    return out, has


def _take_spans(data: np.ndarray, start: np.ndarray, take: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray]:
    """Rows ``take`` of a ragged array (``data[start[i]:start[i+1]]`` is row i) → the
    concatenated rows and their new start offsets."""
    n = start[take + 1] - start[take]
    out_start = np.concatenate([[0], np.cumsum(n)]).astype(np.int64)
    return data[np.repeat(start[take], n) + ranges(n)], out_start


def gather_images(blocks: Mapping[int, ImageBlock], block_ids: np.ndarray, rows: np.ndarray
                  ) -> tuple[ImageBlock, np.ndarray]:
    """One contiguous block holding the images (``block_ids[i]``, ``rows[i]``), and for each
    i its row in that block (equal pairs share a row).

    The batcher gathers each window into one block: every batch of the window then reads
    from one set of arrays (a batch drawn from dozens of small blocks cost a loop per block),
    and the window's source blocks can be released."""
    ident = block_ids.astype(np.int64) * (1 << 32) + rows
    uniq, index = np.unique(ident, return_inverse=True)
    ub, ur = uniq >> 32, uniq & ((1 << 32) - 1)
    parts = [_take_rows(blocks[int(b)], ur[ub == b]) for b in np.unique(ub)]
    return _concat(parts), index.astype(np.int64)   # uniq is sorted by (block, row)


def _take_rows(blk: ImageBlock, rows: np.ndarray) -> ImageBlock:
    caps_per_row = blk.cap_start[rows + 1] - blk.cap_start[rows]
    cap_index = np.repeat(blk.cap_start[rows], caps_per_row) + ranges(caps_per_row)
    tokens, tok_start = _take_spans(blk.tokens, blk.tok_start, cap_index)
    out = ImageBlock(None, blk.image_key[rows], blk.source_index[rows],
                     np.concatenate([[0], np.cumsum(caps_per_row)]).astype(np.int64),
                     tok_start, tokens, 0, 0)
    if blk.features is not None:
        out.num_regions = blk.num_regions[rows]
        out.features, out.region_start = _take_spans(blk.features, blk.region_start, rows)
        out.region_loc, _ = _take_spans(blk.region_loc, blk.region_start, rows)
        if blk.soft_labels is not None:
            out.soft_labels, _ = _take_spans(blk.soft_labels, blk.region_start, rows)
        if blk.image_feature is not None:
            out.image_feature = blk.image_feature[rows]
            out.has_image_feature = blk.has_image_feature[rows]
    if blk.pixel_data is not None:
        out.pixel_data, out.pixel_start = _take_spans(blk.pixel_data, blk.pixel_start, rows)
        out.pixel_hw = blk.pixel_hw[rows]
    return out


def _concat(parts: list[ImageBlock]) -> ImageBlock:
    if len(parts) == 1:
        return parts[0]

    def cat(name):
        return np.concatenate([getattr(p, name) for p in parts])

    def starts(name):
        offs = np.cumsum([0] + [getattr(p, name)[-1] for p in parts[:-1]])
        return np.concatenate([getattr(p, name)[:-1] + o for p, o in zip(parts, offs)]
                              + [[offs[-1] + getattr(parts[-1], name)[-1]]]).astype(np.int64)

    out = ImageBlock(None, cat("image_key"), cat("source_index"), starts("cap_start"),
                     starts("tok_start"), cat("tokens"), 0, 0)
    first = parts[0]
    if first.features is not None:
        out.num_regions, out.region_start = cat("num_regions"), starts("region_start")
        out.features, out.region_loc = cat("features"), cat("region_loc")
        if first.soft_labels is not None:
            out.soft_labels = cat("soft_labels")
        if all(p.image_feature is not None for p in parts):
            out.image_feature = cat("image_feature")
            out.has_image_feature = cat("has_image_feature")
    if first.pixel_data is not None:
        out.pixel_data, out.pixel_start = cat("pixel_data"), starts("pixel_start")
        out.pixel_hw = cat("pixel_hw")
    return out
