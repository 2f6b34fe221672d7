"""``ImageBlock``: numpy views over one Arrow table of transformed image rows (zero copy).

The worker's batcher keeps a few blocks alive in its window and refers to examples as
(block, row, caption); the collate gathers from these views.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from vlp.datasets.arrow_views import binary_parts, flat_numpy, list_parts


def image_key(image_id: str) -> int:
    """A stable 63-bit identity of an image id (the same in every process, unlike hash())."""
    return int.from_bytes(hashlib.blake2b(image_id.encode(), digest_size=8).digest(),
                          "little") >> 1


@dataclass
class ImageBlock:
    table: pa.Table              # keeps the Arrow buffers alive
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
        ids = table.column("image_id").to_pylist()
        block = cls(
            table=table,
            image_key=np.fromiter((image_key(i) for i in ids), dtype=np.int64, count=len(ids)),
            source_index=table.column("source_index").to_numpy().astype(np.int64),
            cap_start=cap_start, tok_start=tok_start, tokens=flat_numpy(tokens, np.int32),
            n_overlong=int(np.sum(table.column("n_overlong").to_numpy())),
            n_truncated=int(np.sum(table.column("n_truncated").to_numpy())))
        names = table.column_names
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
        if "pixels" in names:
            block.pixel_start, block.pixel_data = binary_parts(table.column("pixels"))
            block.pixel_hw = np.stack([table.column("pixel_h").to_numpy(),
                                       table.column("pixel_w").to_numpy()], 1).astype(np.int64)
        return block
