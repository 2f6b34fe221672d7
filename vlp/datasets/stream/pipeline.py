"""The Ray Data pipeline (the only module of ``vlp.datasets`` that imports Ray).

Driver::

    plan = plan_data(data_config, tasks=mix)       # all checks, before any row is read
    ds = build_dataset(plan)                        # read_parquet → ImageRowTransform
    TorchTrainer(loop, datasets={"train": ds}, train_loop_config={"plan": plan, ...})

Worker (inside the train loop)::

    blocks = shard_blocks(ray.train.get_dataset_shard("train"), plan)
    batches = PretrainBatches(plan, blocks, rank=ctx.get_world_rank(),
                              world_size=ctx.get_world_size(),
                              epoch_sync=AnyRank())   # vlp.platform.pretrain.components
    batch = batches.next(sampler.next())

The dataset yields image rows (Arrow blocks); the worker expands them into pairs, buckets
them by input units and masks for the drawn task (``PretrainBatches``). For fixed-size
batches of one task (evaluation), ``iter_torch_batches(collate_fn=TaskCollateFn(plan, task))``
works on the same dataset.
"""

from __future__ import annotations

import logging
import os
from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import ray
import ray.data
import torch
from ray.data.collate_fn import ArrowBatchCollateFn

from vlp.datasets.batching.collate import ExampleRefs
from vlp.datasets.stream.data_plan import DataPlan
from vlp.datasets.stream.footer_readers import sized_footer_pool
from vlp.datasets.batching.image_block import ImageBlock
from vlp.contract.uri_files import filesystem, is_uri, open_input
from vlp.datasets.stream.image_rows import PATH_COLUMN, ImageRowTransform
from vlp.datasets.batching.summed_batch import summed_batch
from vlp.datasets.batching.task_batch import mask_context, task_batch
from vlp.datasets.stream.text_tokenizer import load_tokenizer

log = logging.getLogger(__name__)

CACHE_BLOCK_ROWS = 256


def build_dataset(plan: DataPlan, *, reshuffle_files: bool = True) -> ray.data.Dataset:
    """Shards of every source with a positive weight → tokenized, region-selected image rows.
    The map runs as tasks, not actors.

    ``reshuffle_files``: a new (seeded) file order every epoch; False keeps one seeded order
    for every execution — with Ray Data's ``preserve_order`` each rank then receives the same
    blocks every epoch and in a restarted run (deterministic streams, exact resume).

    With ``cache`` (auto: when the rows take under a quarter of the object store) the rows
    are computed once here and kept in the object store; each epoch then only reorders the
    blocks (unless ``reshuffle_files`` is False), instead of restarting the read (2–7 s per
    epoch on a 2-core machine). The rows are deterministic, so caching changes no example;
    all the randomness is worker-side."""
    cfg = plan.config
    shuffle = ray.data.FileShuffleConfig(seed=cfg.seed, reseed_after_execution=reshuffle_files)
    files, fs = plan.files, None
    if files and is_uri(files[0]):   # s3://...: our filesystem (endpoint from the environment)
        fs, _ = filesystem(files[0])
        files = [filesystem(f)[1] for f in files]
    with sized_footer_pool(len(files)):     # Ray's 32 footer actors: a process start each
        ds = ray.data.read_parquet(files, include_paths=True, shuffle=shuffle, filesystem=fs)
    # projection is pushed down into the Parquet read: unused columns (pixels) are not read
    ds = ds.select_columns([*plan.read_columns, PATH_COLUMN])
    ds = ds.map_batches(ImageRowTransform(plan), batch_format="pyarrow", batch_size=None,
                        zero_copy_batch=True)
    if not reshuffle_files:   # also the cached blocks in file order, whatever task ends first
        ds.context.execution_options.preserve_order = True
    if _should_cache(plan):
        # small corpora arrive as one block (Ray bins small files into one read task):
        # blocks of ~CACHE_BLOCK_ROWS images give the per-epoch block shuffle something to do
        rows = sum(pq.ParquetFile(open_input(f)).metadata.num_rows for f in plan.files)
        ds = ds.repartition(max(1, -(-rows // CACHE_BLOCK_ROWS))).materialize()
        if reshuffle_files:
            ds = ds.randomize_block_order()
    return ds


def _should_cache(plan: DataPlan) -> bool:
    mode = plan.config.cache
    if mode != "auto":
        return mode == "always"
    if plan.config.visual == "regions":   # selected regions: at most the stored features
        size = sum(_size(f) for f in plan.files)
    else:                                   # decoded, resized pixels
        px = plan.config.pixels
        rows = sum(pq.ParquetFile(open_input(f)).metadata.num_rows for f in plan.files)
        size = rows * px.shorter_side * px.longer_max * 3
    store = ray.cluster_resources().get("object_store_memory", 0)
    cache = size < 0.25 * store
    log.info("data cache: rows ~%.1f MB, object store %.1f MB → %s", size / 2**20,
             store / 2**20, "cached after the first pass" if cache else "streamed every epoch")
    return cache


def _size(f: str) -> int:
    if not is_uri(f):
        return os.path.getsize(f)
    fs, path = filesystem(f)
    return fs.get_file_info(path).size


def shard_blocks(shard, plan: DataPlan):
    """``blocks(epoch)`` over a Ray ``DataIterator`` (``get_dataset_shard``) or a Dataset.

    Ray Data's own blocks are handed over as they are (``batch_size=None``): re-slicing them
    into ``read_rows``-row batches cost a third of the stream's throughput (demo world, 2
    cores: 65k against 101k pairs/s, even at 256 rows). A block is at most Ray Data's
    ``target_max_block_size``; cached rows come in blocks of ``CACHE_BLOCK_ROWS``."""

    def epoch_blocks(epoch: int):
        return shard.iter_batches(batch_size=None, batch_format="pyarrow", prefetch_batches=2)

    return epoch_blocks


class TaskCollateFn(ArrowBatchCollateFn):
    """Fixed-size batches for ``iter_torch_batches``: every (image, caption) pair of the
    batch's image rows, masked for one task, or for a tuple of tasks (the ``summed``
    objective) a batch per task of those pairs (``summed_batch``; no bucketing: evaluation and
    debugging)."""

    def __init__(self, plan: DataPlan, task: str | tuple[str, ...], seed: int = 0):
        self.plan, self.task = plan, task
        self.rng = np.random.default_rng([plan.config.seed, seed, 0xC011])
        self._ctx = None   # built on first use, in the process that collates

    def __call__(self, table: pa.Table) -> dict[str, torch.Tensor]:
        tok = load_tokenizer(self.plan.tokenizer_path or None)
        if self._ctx is None:   # once: it tokenizes the object words
            self._ctx = mask_context(self.plan, tok)
        block = ImageBlock.from_table(table, self.plan.feature_dim, self.plan.num_classes,
                                      self.plan.loc_dim)
        n = block.num_captions()
        rows = np.repeat(np.arange(block.num_images), n)
        caps = np.arange(len(rows)) - np.repeat(block.cap_start[:-1], n)
        zeros = np.zeros(len(rows), np.int64)
        refs = ExampleRefs(zeros, rows, caps, zeros, rows, np.ones(len(rows), bool))
        if isinstance(self.task, tuple):
            rngs = self.rng.spawn(len(self.task))
            return summed_batch(self.plan, tok, self._ctx, {0: block}, refs, self.task,
                                rngs.__getitem__, Counter())
        return task_batch(self.plan, tok, self._ctx, {0: block}, refs, self.task, self.rng,
                          Counter())
