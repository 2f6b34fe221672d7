"""The plain local stream: the same transform as the Ray Data map, run in-process with pyarrow.

For evaluation, tests and single-process debugging: no Ray needed. Rows are split across
``num_shards`` readers by chunks of ``read_rows`` rows (disjoint), in a file and chunk order
shuffled per epoch with the config seed, so a run is reproducible.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from vlp.contract.uri_files import open_input
from vlp.datasets.stream.data_plan import DataPlan
from vlp.datasets.stream.image_rows import ImageRowTransform
from vlp.datasets.batching.pretrain_batches import PretrainBatches


def local_blocks(plan: DataPlan, shard_index: int = 0, num_shards: int = 1) -> LocalBlocks:
    if not 0 <= shard_index < num_shards:
        raise ValueError(f"shard_index {shard_index} outside [0, {num_shards})")
    return LocalBlocks(plan, shard_index, num_shards)


class LocalBlocks:
    """``blocks(epoch)`` → this shard's transformed Arrow blocks of that epoch. Plain data
    and files only: it reads the same in any process (a batch builder process reads the
    shards itself, ``reads_anywhere``)."""

    reads_anywhere = True

    def __init__(self, plan: DataPlan, shard_index: int, num_shards: int):
        self.plan, self.shard_index, self.num_shards = plan, shard_index, num_shards
        self.source_of = plan.source_of_file()
        read_rows = plan.config.read_rows
        self.chunks = [(f, start) for f in plan.files
                       for start in range(0, pq.ParquetFile(open_input(f)).metadata.num_rows,
                                          read_rows)]
        self._transform: ImageRowTransform | None = None   # built where it is used

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_transform": None}

    def __call__(self, epoch: int) -> Iterator[pa.Table]:
        for part in self.parts(epoch):
            yield from self.read_part(part)

    def parts(self, epoch: int) -> list[tuple[str, tuple[int, ...]]]:
        """The epoch's reads in order: (file, the starts of this shard's chunks of it), one
        file read each. ``__call__`` is ``read_part`` over them; a pool of builder processes
        shares them out (``training.shared_reads``), each part read by one member."""
        cfg = self.plan.config
        rng = np.random.default_rng([cfg.seed, epoch, 0xF11E])
        mine = [self.chunks[i] for i in rng.permutation(len(self.chunks))
                ][self.shard_index::self.num_shards]
        by_file: dict[str, list[int]] = {}
        for f, start in mine:
            by_file.setdefault(f, []).append(start)
        return [(f, tuple(by_file[f])) for f in sorted(by_file, key=lambda f: rng.random())]

    @staticmethod
    def part_name(part: tuple[str, tuple[int, ...]]) -> str:
        return str(part[0])

    def read_part(self, part: tuple[str, tuple[int, ...]]) -> Iterator[pa.Table]:
        """The transformed blocks of one part of ``parts`` (empty chunks left out)."""
        cfg, plan = self.plan.config, self.plan
        if self._transform is None:
            self._transform = ImageRowTransform(plan)
        f, starts = part
        table = pq.read_table(open_input(f), columns=list(plan.read_columns))
        for start in starts:
            out = self._transform(table.slice(start, cfg.read_rows),
                                  source_index=self.source_of[f])
            if out.num_rows:
                yield out


def local_batches(plan: DataPlan, *, rank: int = 0, world_size: int = 1,
                  with_ids: bool = False) -> PretrainBatches:
    """``PretrainBatches`` over this process's share of the shards, without Ray; under
    ``data.stream: global`` over all of them, this rank taking every ``world_size``-th
    batch."""
    if plan.config.stream == "global":
        return PretrainBatches(plan, local_blocks(plan), rank=rank, with_ids=with_ids,
                               world_size=world_size, global_order=True)
    return PretrainBatches(plan, local_blocks(plan, rank, world_size), rank=rank,
                           with_ids=with_ids, world_size=world_size)
