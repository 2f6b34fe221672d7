"""``ImageStore``: the downstream images of one split, looked up by ``image_id``.

The shards are read once with pyarrow and pushed through the pretraining pipeline's own row
transform (``ImageRowTransform``: region selection, location features, fp16 features or
decoded pixels), so a finetuned model sees its regions exactly as pretraining showed them.
The result is one :class:`~vlp.datasets.batching.image_block.ImageBlock` whose arrays are views of
Arrow buffers: no per-image Python objects, and host memory does not grow per step.
"""

from __future__ import annotations

from dataclasses import dataclass
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from vlp.contract import uri_files
from vlp.contract.uri_files import open_input
from vlp.datasets.storage.arrow_views import flat_numpy, list_parts
from vlp.datasets.batching.collate import ExampleRefs, pixel_arrays, region_arrays
from vlp.datasets.stream.data_config import DataConfig, RegionConfig, SourceConfig
from vlp.datasets.stream.data_plan import PIXEL_COLUMNS, REGION_COLUMNS, DataPlan
from vlp.datasets.downstream.downstream_config import DownstreamDataConfig
from vlp.datasets.downstream.data_errors import DownstreamDataError, MissingImagesError
from vlp.datasets.batching.image_block import ImageBlock
from vlp.datasets.stream.image_rows import ImageRowTransform
from vlp.datasets.stream.location import LOCATION_FEATURES
from vlp.datasets.stream.region_select import select_regions
from vlp.datasets.storage.shards import shard_info
from vlp.datasets.storage.shard_format import ShardError
from vlp.datasets.stream.text_tokenizer import resolve_tokenizer_path
from vlp.datasets.storage.world import WorldError, load_manifest

# every region of a ground-truth-box store is an annotated object: keep them all, in order
GT_REGIONS = RegionConfig(conf_threshold=0.0, min_regions=1, max_regions=100)


@dataclass
class ImageStore:
    files: list[str]
    block: ImageBlock           # one block, every image of the split
    row_of: dict[str, int]      # image_id → row of the block
    boxes: np.ndarray | None    # float32 [regions, 4] pixels, the kept boxes (regions input)
    sizes: np.ndarray           # int64 [I, 2] (width, height)
    feature_dim: int
    loc_dim: int
    cfg: DownstreamDataConfig

    @classmethod
    def open(cls, cfg: DownstreamDataConfig, split: str, *, gt: bool = False) -> "ImageStore":
        """The images of ``split`` of the world's downstream source (``gt``: the features
        extracted on the annotated boxes, RefCOCO+'s ground-truth setting)."""
        try:
            files = split_files(cfg, split, gt)
        except WorldError as e:
            raise DownstreamDataError(str(e)) from None
        return cls.from_files(files, cfg, regions=GT_REGIONS if gt else cfg.regions)

    @classmethod
    def from_files(cls, files: list[str], cfg: DownstreamDataConfig,
                   regions: RegionConfig | None = None) -> "ImageStore":
        regions = regions or cfg.regions
        dims = set()
        for f in files:
            try:
                dims.add(shard_info(f).feature_dim)
            except ShardError as e:
                raise DownstreamDataError(str(e)) from None
        feature_dim = dims.pop() if len(dims) == 1 else None
        if cfg.visual == "regions":
            if feature_dim is None:
                raise DownstreamDataError(f"image shards disagree on the feature width {dims}: "
                                          f"{files}")
            if cfg.feature_dim and cfg.feature_dim != feature_dim:
                raise DownstreamDataError(
                    f"the model expects region features of width {cfg.feature_dim}, the image "
                    f"shards hold width {feature_dim} ({files[0]}): finetune a model built "
                    f"for this feature store")
        columns = list(REGION_COLUMNS if cfg.visual == "regions"
                       else PIXEL_COLUMNS + ("width", "height"))
        if cfg.visual == "regions" and cfg.image_feat and all(
                "image_feature" in pq.read_schema(open_input(f)).names for f in files):
            columns.append("image_feature")   # VL-BERT: the whole-image RoI, as in pretraining
        table = pa.concat_tables([pq.read_table(open_input(f), columns=columns) for f in files])
        # downstream images carry no captions; empty lists let the row transform keep them
        empty = pa.array([[]] * table.num_rows, pa.list_(pa.string()))
        table = table.set_column(table.column_names.index("captions"), "captions", empty)
        plan = _plan(cfg, regions, feature_dim or 0, files)
        rows = ImageRowTransform(plan)(table, source_index=0)
        block = ImageBlock.from_table(rows, plan.feature_dim, None, plan.loc_dim)
        ids = rows.column("image_id").to_pylist()
        row_of = {i: k for k, i in enumerate(ids)}
        if len(row_of) != len(ids):
            dup = next(i for i in ids if ids.count(i) > 1)
            raise DownstreamDataError(f"image id {dup!r} appears twice in {files}")
        boxes = None
        if cfg.visual == "regions":   # the same selection as the row transform: keep the boxes
            _, conf = list_parts(table.column("confidences"))
            sel = select_regions(flat_numpy(conf, np.float32),
                                 table.column("num_boxes").to_numpy().astype(np.int64), regions)
            _, flat = list_parts(table.column("boxes"))
            boxes = flat_numpy(flat, np.float32).reshape(-1, 4)[sel.keep]
        sizes = np.stack([table.column("width").to_numpy(), table.column("height").to_numpy()],
                         1).astype(np.int64)
        return cls(files, block, row_of, boxes, sizes, plan.feature_dim, plan.loc_dim, cfg)

    # ---- lookups -----------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.row_of)

    @property
    def image_ids(self) -> list[str]:
        return list(self.row_of)

    def rows(self, image_ids, table: str = "task table") -> np.ndarray:
        """Block rows of ``image_ids``; every id the store lacks is reported at once."""
        out = np.fromiter((self.row_of.get(i, -1) for i in image_ids), np.int64)
        if (out < 0).any():
            missing = sorted({i for i, r in zip(image_ids, out) if r < 0})
            raise MissingImagesError(table, missing, len(set(image_ids)), self.files)
        return out

    def region_boxes(self, row: int) -> np.ndarray:
        """[n, 4] pixel boxes of the regions the model sees for image ``row``, in input order."""
        start, end = self.block.region_start[row], self.block.region_start[row + 1]
        return self.boxes[start:end]

    def num_regions(self, rows: np.ndarray) -> np.ndarray:
        return self.block.num_regions[rows]

    def visual_arrays(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        """The visual side of a batch (regions or pixels), one image per example."""
        rows = np.asarray(rows, np.int64)
        zeros = np.zeros(len(rows), np.int64)
        refs = ExampleRefs(zeros, rows, zeros, zeros, rows, np.ones(len(rows), bool))
        if self.cfg.visual == "regions":
            return region_arrays([self.block], refs, self.feature_dim, self.loc_dim, None, False)
        return pixel_arrays([self.block], refs, self.cfg.pixels)


def split_files(cfg: DownstreamDataConfig, split: str, gt: bool = False) -> list[str]:
    """The image shards of ``split`` (paths, or URIs for a world in shared storage): the
    downstream source's, or (``gt``) the ground-truth-box feature shards the world lists as a
    sidecar (``<folder>/<split>-NNNNN.parquet``)."""
    manifest = load_manifest(cfg.world)
    if gt:
        rel = manifest.sidecars.get(cfg.gt_sidecar)
        if rel is None:
            raise WorldError(f"{cfg.world}: the world has no ground-truth-box features (no "
                             f"sidecar {cfg.gt_sidecar!r} in its manifest; regenerate it with "
                             f"this version of `vlp data synth`, or import them)")
        files = [str(f) for f in uri_files.glob(manifest.path(rel), f"{split}-*.parquet")]
        what = f"ground-truth-box feature shards in {rel}"
    else:
        if cfg.image_source not in manifest.sources:
            raise WorldError(f"{cfg.world}: the world has no image source "
                             f"{cfg.image_source!r}; its sources: {sorted(manifest.sources)}")
        files = [str(f) for f in manifest.image_files(source=cfg.image_source, split=split)]
        what = f"shards of source {cfg.image_source!r}"
    if not files:
        raise WorldError(f"{cfg.world}: no {split!r} {what}")
    return files


def _plan(cfg: DownstreamDataConfig, regions: RegionConfig, feature_dim: int,
          files: list[str]) -> DataPlan:
    """A one-source DataPlan, so the pipeline's row transform can be reused unchanged."""
    data = DataConfig(sources=(SourceConfig("downstream", str(uri_files.parent(files[0]))),),
                      split=None, tokenizer_path=cfg.tokenizer_path, regions=regions,
                      location=cfg.location, visual=cfg.visual, pixels=cfg.pixels)
    columns = REGION_COLUMNS if cfg.visual == "regions" else PIXEL_COLUMNS
    return DataPlan(data, ("itm",), (), feature_dim=feature_dim, num_classes=None,
                    tokenizer_path=str(resolve_tokenizer_path(cfg.tokenizer_path)),
                    read_columns=columns, needs_soft_labels=False)


__all__ = ["ImageStore", "GT_REGIONS", "LOCATION_FEATURES"]
