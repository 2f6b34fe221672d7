"""The keys the audit matches images by, read once per source with the source's statistics.

Real leaks arrive under other ids (UNITER had to match COCO and Flickr30K by URL), so every
image row gets three keys: its id, a hash of its region-feature bytes, and a hash of its
decoded pixels (a re-encoded PNG/JPEG still matches).

Ids compare across sources only when they are not bare numbers: a number is a counter local
to its corpus (COCO 391895, a Visual Genome image 391895 and line 391895 of Conceptual
Captions are three different pictures), while a spelled-out id (``downstream_000123``, a URL
hash) names one image wherever it appears.
"""

from __future__ import annotations

import hashlib
import io
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow.compute as pc

from vlp.datasets.storage.shards import read_image_shard


def id_key(source: str, image_id: str) -> str:
    """The image-id key: corpus-local for numeric ids, global otherwise (see module doc)."""
    return f"{source}/{image_id}" if image_id.isdigit() else image_id


def pixel_key(blob: bytes | None) -> str | None:
    if blob is None:
        return None
    from PIL import Image
    try:
        with Image.open(io.BytesIO(blob)) as im:
            rgb = im.convert("RGB")
            return hashlib.sha1(f"{rgb.size}".encode() + rgb.tobytes()).hexdigest()
    except Exception:  # noqa: BLE001 - undecodable bytes still match byte-for-byte
        return "raw:" + hashlib.sha1(blob).hexdigest()


@dataclass
class SourceRows:
    """Every image row of one source: where it is and its three keys (row order = read order)."""
    name: str
    domain: str
    ids: list[str] = field(default_factory=list)
    splits: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)        # relative shard path of each row
    features: list[str] = field(default_factory=list)     # sha1 of the fp16 feature bytes
    pixels: list[str | None] = field(default_factory=list)
    captioned: list[bool] = field(default_factory=list)   # pretraining reads captioned rows
    row_of: dict[str, int] = field(default_factory=dict)  # image id → row (first occurrence)

    def keys(self, row: int) -> dict[str, str | None]:
        return {"image_id": id_key(self.name, self.ids[row]), "features": self.features[row],
                "pixels": self.pixels[row]}

    def where(self, row: int) -> str:
        return f"{self.name}:{self.splits[row]}"


@dataclass
class SourceStats:
    regions: list[np.ndarray] = field(default_factory=list)
    captions_per_image: list[np.ndarray] = field(default_factory=list)
    tokens: list[np.ndarray] = field(default_factory=list)
    splits: Counter = field(default_factory=Counter)
    class_hist: Counter = field(default_factory=Counter)


def token_counts(texts: list[str], tok) -> np.ndarray:
    if not texts:
        return np.zeros(0, np.int64)
    if tok is None:
        return np.array([len(t.split()) for t in texts])
    return np.array([len(e.ids) for e in tok.encode_batch(texts, add_special_tokens=False)])


def read_source(root: Path, name: str, domain: str, files: list[str], tok
                ) -> tuple[SourceRows, SourceStats]:
    rows, stats = SourceRows(name, domain), SourceStats()
    for rel in files:
        table, shard = read_image_shard(root / rel)
        ids = table.column("image_id").to_pylist()
        split_col = table.column("split").to_pylist()
        stats.splits.update(split_col)
        stats.regions.append(table.column("num_boxes").to_numpy())
        if table.column("captions").null_count < table.num_rows:
            caps = table.column("captions")
            stats.captions_per_image.append(
                pc.fill_null(pc.list_value_length(caps), 0).to_numpy())
            stats.tokens.append(token_counts(pc.list_flatten(caps).to_pylist(), tok))
        if shard.num_classes and table.column("soft_labels").null_count < table.num_rows:
            for blob in table.column("soft_labels").to_pylist():
                if blob is not None:
                    soft = np.frombuffer(blob, "<f2").reshape(-1, shard.num_classes)
                    stats.class_hist.update(soft.argmax(1).tolist())
        captioned = table.column("captions").is_valid().to_pylist()
        for iid, sp, f, p, c in zip(ids, split_col, table.column("features").to_pylist(),
                                    table.column("pixels").to_pylist(), captioned):
            rows.row_of.setdefault(iid, len(rows.ids))
            rows.ids.append(iid)
            rows.splits.append(sp)
            rows.files.append(rel)
            rows.features.append(hashlib.sha1(f).hexdigest())
            rows.pixels.append(pixel_key(p))
            rows.captioned.append(bool(c))
    return rows, stats
