"""What every benchmark adapter shares: its task table, its images, its tokenizer, and the
final assembly of a batch (bookkeeping counts, VL-BERT's whole-image feature, torch)."""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch

from vlp.contract import batch_spec as K
from vlp.datasets.downstream.downstream_config import DownstreamDataConfig
from vlp.datasets.downstream.data_errors import DownstreamDataError
from vlp.datasets.downstream.image_store import ImageStore
from vlp.datasets.downstream.text import TokenizedTexts
from vlp.datasets.batching.task_batch import to_torch, whole_image_feature
from vlp.datasets.storage.task_tables import read_task_table
from vlp.datasets.storage.shard_format import ShardError
from vlp.datasets.stream.text_tokenizer import TextTokenizer, load_tokenizer
from vlp.datasets.storage.world import WorldError, load_manifest


@lru_cache(maxsize=8)
def image_store(cfg: DownstreamDataConfig, split: str, gt: bool = False) -> ImageStore:
    """One store per (config, split) per process: benchmarks on the same images share it."""
    return ImageStore.open(cfg, split, gt=gt)


class TableData:
    """A benchmark's task table of one split with its images."""

    task: str = ""           # the TASK_SCHEMAS name of the table

    def __init__(self, cfg: DownstreamDataConfig, split: str, *, gt: bool = False):
        self.cfg, self.split = cfg, split
        try:
            self.path = str(load_manifest(cfg.world).task_file(self.task, split))
            self.table, _ = read_task_table(self.path, self.task)
        except (WorldError, ShardError) as e:
            raise DownstreamDataError(str(e)) from None
        if self.table.num_rows == 0:
            raise DownstreamDataError(f"{self.path}: the {self.task} table is empty")
        self.images = image_store(cfg, split, gt)
        self.tok: TextTokenizer = load_tokenizer(cfg.tokenizer_path)

    def __len__(self) -> int:
        return self.table.num_rows

    def column(self, name: str) -> list:
        return self.table.column(name).to_pylist()

    def image_rows(self, *columns: str) -> np.ndarray:
        """Image-store rows of the ids in ``columns`` (all columns checked together, so the
        error counts every missing id of the table)."""
        ids = [i for c in columns for i in self.column(c)]
        rows = self.images.rows(ids, table=self.path)
        return rows.reshape(len(columns), -1) if len(columns) > 1 else rows

    def texts(self, column: str | list[str]) -> TokenizedTexts:
        values = self.column(column) if isinstance(column, str) else column
        return TokenizedTexts.encode(self.tok, values, self.cfg.max_text_len)

    def assemble(self, text: dict[str, np.ndarray], visual: dict[str, np.ndarray],
                 num_examples: int, labels: dict[str, np.ndarray | int]) -> dict[str, torch.Tensor]:
        batch = {**text, **visual}
        rows, t = batch[K.INPUT_IDS].shape
        if K.REGION_FEATS in batch:
            width = t + batch[K.REGION_FEATS].shape[1]
            if self.cfg.image_feat:
                batch[K.IMAGE_FEAT] = whole_image_feature(batch)
        else:
            width = t
        batch[K.NUM_EXAMPLES] = np.array(num_examples, np.int64)
        batch[K.INPUT_UNITS] = np.array(rows * width, np.int64)
        for k, v in labels.items():
            batch[k] = np.asarray(v)
        return to_torch(batch)


def concat_visual(parts: list[dict[str, np.ndarray]], types: tuple[int, int]
                  ) -> dict[str, np.ndarray]:
    """Two images in one sequence (NLVR2 triplet): regions side by side (the model packs out
    the padding between them), each image's regions of its own token type ``types[i]``."""
    a, b = parts
    out = {k: np.concatenate([a[k], b[k]], axis=1) for k in (K.REGION_FEATS, K.REGION_LOC,
                                                             K.REGION_MASK)}
    na, nb = a[K.REGION_MASK].shape[1], b[K.REGION_MASK].shape[1]
    rows = len(a[K.REGION_MASK])
    out[K.REGION_TYPE_IDS] = np.concatenate([np.full((rows, na), types[0], np.int64),
                                             np.full((rows, nb), types[1], np.int64)], 1)
    return out


