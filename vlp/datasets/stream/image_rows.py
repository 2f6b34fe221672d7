"""The Ray Data map: image-shard rows → tokenized, region-selected image rows.

Runs as a task-based ``map_batches`` (and in-process in the local stream), vectorised over a
block. Per image it keeps the rows of the configured split that have captions, tokenizes every
caption (over-long ones dropped or truncated and counted), selects regions and computes their
location features (or decodes and resizes the pixels). Rows stay *images*: the expansion into
(image, caption) pairs happens in the worker's batcher, so an image's features cross the
object store and sit in the batching window once, not once per caption (COCO has five).

Output columns: image_id, image_key (``image_key(image_id)``, hashed once here rather than
in every epoch's batcher), source_index, caption_ids (list<list<int32>>, no [CLS]/[SEP]),
n_overlong, n_truncated; regions: num_regions, region_loc (N·L float32), features (N·D fp16),
soft_labels (N·C fp16, when a task needs them), region_fallback, image_feature (D fp16 or
null, VL-BERT only); pixels: pixels (uint8 h·w·3), pixel_h, pixel_w.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from vlp.datasets.storage.arrow_views import (binary_array, binary_parts, flat_numpy, list_array,
                                              list_parts, ranges)
from vlp.datasets.stream.source_plan import DataPlan   # not data_plan: no torch here
from vlp.datasets.batching.image_block import image_keys
from vlp.datasets.stream.location import LOCATION_FEATURES
from vlp.datasets.stream.pixels import decode_resize
from vlp.datasets.stream.region_select import select_regions
from vlp.datasets.stream.text_tokenizer import load_tokenizer

PATH_COLUMN = "path"   # added by ray.data.read_parquet(include_paths=True)


class ImageRowTransform:
    """A callable instance (not a class) for ``map_batches``: Ray runs it as tasks, which
    avoids the actor-pool deadlock on small machines (RAY_GUIDE.md)."""

    def __init__(self, plan: DataPlan):
        self.plan = plan
        self._source_of_file = plan.source_of_file()

    def __call__(self, table: pa.Table, source_index: int | None = None) -> pa.Table:
        cfg = self.plan.config
        keep = pc.is_valid(table.column("captions"))
        if cfg.split is not None:
            keep = pc.and_(keep, pc.equal(table.column("split"), cfg.split))
        table = table.filter(keep)
        src = self._source_indices(table, source_index)
        image_id = _single(table.column("image_id")).cast(pa.string())
        cols: dict[str, pa.Array] = {
            "image_id": image_id,
            "image_key": pa.array(image_keys(image_id.to_pylist()), pa.int64()),
            "source_index": pa.array(src, pa.int16()),
        }
        cols.update(self._captions(table))
        if cfg.visual == "regions":
            cols.update(self._regions(table))
        else:
            cols.update(self._pixels(table))
        return pa.table(cols)

    # ---- pieces ---------------------------------------------------------------------------

    def _source_indices(self, table: pa.Table, source_index: int | None) -> np.ndarray:
        if source_index is not None:
            return np.full(table.num_rows, source_index, dtype=np.int16)
        paths = table.column(PATH_COLUMN).to_pylist()
        cache: dict[str, int] = {}
        return np.array([cache.setdefault(p, self._lookup(p)) for p in paths], dtype=np.int16)

    def _lookup(self, path: str) -> int:
        if path in self._source_of_file:
            return self._source_of_file[path]
        for f, i in self._source_of_file.items():   # Ray may report paths in another form
            if f.endswith(path) or path.endswith(f):
                return i
        raise KeyError(f"{path}: not a shard of any configured source")

    def _captions(self, table: pa.Table) -> dict[str, pa.Array]:
        cfg = self.plan.config
        tok = load_tokenizer(self.plan.tokenizer_path or None)
        cap_off, cap_values = list_parts(table.column("captions"))
        ids, lengths = tok.encode(cap_values.to_pylist())
        owner = np.repeat(np.arange(table.num_rows), np.diff(cap_off))
        over = lengths > cfg.max_text_len
        n_over = np.bincount(owner[over], minlength=table.num_rows)
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
        if cfg.overlong == "truncate":
            kept, new_len = np.ones(len(lengths), bool), np.minimum(lengths, cfg.max_text_len)
        else:
            kept, new_len = ~over, lengths
        new_len = new_len[kept]
        token_index = np.repeat(starts[kept], new_len) + ranges(new_len)
        inner = np.concatenate([[0], np.cumsum(new_len)])
        outer = np.concatenate([[0], np.cumsum(np.bincount(owner[kept],
                                                           minlength=table.num_rows))])
        zero = np.zeros(table.num_rows, np.int16)
        return {
            "caption_ids": list_array(outer, list_array(inner, pa.array(ids[token_index],
                                                                          pa.int32()))),
            "n_overlong": pa.array(n_over.astype(np.int16) if cfg.overlong == "drop" else zero),
            "n_truncated": pa.array(n_over.astype(np.int16) if cfg.overlong == "truncate"
                                    else zero),
        }

    def _regions(self, table: pa.Table) -> dict[str, pa.Array]:
        plan, cfg = self.plan, self.plan.config
        n_boxes = table.column("num_boxes").to_numpy().astype(np.int64)
        _, conf = list_parts(table.column("confidences"))
        sel = select_regions(flat_numpy(conf, np.float32), n_boxes, cfg.regions)
        _, boxes = list_parts(table.column("boxes"))
        boxes = flat_numpy(boxes, np.float32).reshape(-1, 4)[sel.keep]
        owner = np.repeat(np.arange(table.num_rows), sel.counts)
        w = table.column("width").to_numpy()[owner]
        h = table.column("height").to_numpy()[owner]
        loc = LOCATION_FEATURES[cfg.location].fn(boxes, w, h).astype(np.float32)
        region_off = np.concatenate([[0], np.cumsum(sel.counts)]).astype(np.int64)
        out = {
            "num_regions": pa.array(sel.counts.astype(np.int16)),
            "region_loc": list_array(region_off * loc.shape[1], loc.ravel()),
            "features": _gather_rows(table.column("features"), sel.keep, plan.feature_dim,
                                     region_off),
            "region_fallback": pa.array(sel.fallback),
        }
        if "image_feature" in table.column_names:   # read only for VL-BERT (plan_data)
            out["image_feature"] = _single(table.column("image_feature"))
        if plan.needs_soft_labels:
            if table.column("soft_labels").null_count:
                bad = pc.index(pc.is_null(table.column("soft_labels")), True).as_py()
                raise ValueError(f"image {table.column('image_id')[bad].as_py()!r} has no "
                                 f"soft_labels, which the tasks {list(plan.tasks)} need")
            out["soft_labels"] = _gather_rows(table.column("soft_labels"), sel.keep,
                                              plan.num_classes, region_off)
        return out

    def _pixels(self, table: pa.Table) -> dict[str, pa.Array]:
        cfg = self.plan.config.pixels
        images = [decode_resize(b, cfg) for b in table.column("pixels").to_pylist()]
        off = np.concatenate([[0], np.cumsum([im.size for im in images])]).astype(np.int64)
        data = np.concatenate([im.ravel() for im in images]) if images else np.zeros(0, np.uint8)
        return {
            "pixels": binary_array(off, data),
            "pixel_h": pa.array(np.array([im.shape[0] for im in images], np.int16)),
            "pixel_w": pa.array(np.array([im.shape[1] for im in images], np.int16)),
        }


def _gather_rows(col, keep: np.ndarray, width: int, out_off: np.ndarray) -> pa.Array:
    """Rows ``keep`` of the flat fp16 [regions, width] matrix stored in a binary column."""
    _, data = binary_parts(col)
    rows = data.view("<f2").reshape(-1, width)[keep]
    return binary_array(out_off * width * 2, rows.reshape(-1).view(np.uint8))


def _single(col):
    return col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
