"""``PairTable``: the image–text pairs of one source, light enough to hold for a web corpus.

Curation decides per pair, but several decisions look across the whole corpus (one text on
too many images, one picture under several ids), so every pair is held at once — without its
features: a pair is a few numbers and its text, and each image keeps only its id, split,
size and a hash of its feature bytes (the same picture downloaded twice hashes the same).
Filters that need features (the ITM score) read them back one shard at a time.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from vlp.datasets.storage.arrow_views import binary_parts, list_parts, ranges
from vlp.datasets.storage.shards import read_image_shard


@dataclass
class PairTable:
    files: list[Path]
    # per image (global image index i)
    image_id: list[str] = field(default_factory=list)
    split: list[str] = field(default_factory=list)
    width: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    height: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    content: list[str] = field(default_factory=list)   # sha1 of the feature bytes
    image_file: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    image_row: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    # per pair (p)
    image: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    caption_index: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    original: list[str] = field(default_factory=list)
    text: list[str] = field(default_factory=list)       # cleaned by the clean filter
    itm_score: np.ndarray = field(default_factory=lambda: np.zeros(0))   # NaN: not scored
    quality: np.ndarray = field(default_factory=lambda: np.zeros(0))     # in-vocabulary share

    @property
    def num_pairs(self) -> int:
        return len(self.image)

    @property
    def num_images(self) -> int:
        return len(self.image_id)

    def score(self) -> np.ndarray:
        """What "best scored" means when one picture has several texts: the ITM score when
        the pairs were scored, else the text's in-vocabulary share."""
        return np.where(np.isnan(self.itm_score), self.quality, self.itm_score)


def load_pairs(files: list[Path]) -> PairTable:
    """Every captioned image row of ``files`` (validated shards) as pairs."""
    t = PairTable(list(files))
    widths, heights, files_of, rows_of, image_of, caps_of = [], [], [], [], [], []
    for k, path in enumerate(files):
        table, _ = read_image_shard(path, check_values=False)
        captioned = np.asarray(table.column("captions").is_valid().to_numpy(
            zero_copy_only=False))
        rows = np.flatnonzero(captioned)
        off, data = binary_parts(table.column("features"))
        first = t.num_images
        t.image_id += [table.column("image_id")[int(r)].as_py() for r in rows]
        t.split += [table.column("split")[int(r)].as_py() for r in rows]
        t.content += [hashlib.sha1(data[off[r]:off[r + 1]].tobytes()).hexdigest()
                      for r in rows]
        widths.append(table.column("width").to_numpy()[rows])
        heights.append(table.column("height").to_numpy()[rows])
        files_of.append(np.full(len(rows), k))
        rows_of.append(rows)
        cap_off, caps = list_parts(table.column("captions"))
        texts = caps.to_pylist()
        n = np.diff(cap_off)[rows]
        image_of.append(np.repeat(np.arange(first, first + len(rows)), n))
        caps_of.append(ranges(n))
        t.original += [texts[cap_off[r] + j] for r in rows for j in range(np.diff(cap_off)[r])]
    t.width, t.height = _cat(widths), _cat(heights)
    t.image_file, t.image_row = _cat(files_of), _cat(rows_of)
    t.image, t.caption_index = _cat(image_of), _cat(caps_of)
    t.text = list(t.original)
    t.itm_score = np.full(t.num_pairs, np.nan)
    t.quality = np.ones(t.num_pairs)
    return t


def _cat(parts: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)
