"""``BatchStream``: a rank's stream of image blocks cut into batches of example references
(the window, ``example_window.ExampleWindow``), under ``PretrainBatches``.

Epoch boundaries under Ray Train: a streaming split makes every rank wait at the start of an
epoch until all ranks get there, while budget batching gives ranks different batch counts per
epoch; a rank that finished its epoch would wait for one still stepping, which waits for it
in the gradient all-reduce: a deadlock. So with several ranks the loader takes an
``epoch_sync`` (a cross-rank agreement, e.g. an all-reduce of a flag): every rank ends the
epoch at the same step: the first rank to run out says so before its batch, and the others
drop the batches they have left of that epoch (``stats["epoch_tail_dropped"]``, a few per
epoch), which also makes a multi-worker stream deterministic.

Exact resume: the window's randomness is seeded per epoch and each batch's (ITM negatives,
masking) by its place in the epoch, so a batch depends on the stream and the seed, not on
the tasks of the batches before it. ``state_dict`` records the epoch and the batches served
in it; a restored loader reads that epoch again and skips those batches without masking
them (region windows are collated as they are cut, skipped batches included). It continues
exactly when the stream is the same every time (the local reader; Ray Data with
``build_dataset(reshuffle_files=False)`` and ``preserve_order``).

One global stream (``data.stream: global``): every rank reads the whole data in the same
order and cuts the same batches as one worker would (seeded as rank 0 of 1), and rank r of W
trains the batches of global index r, r + W, r + 2W, ... (index counted from the stage's
start, across epochs), passing over the others without masking them (region windows collate
only this rank's). No rank waits for another at an epoch's end, so there is no epoch sync
and nothing is dropped. The position is the global index: ``load_resharded_state`` moves W
saved ranks to another number of ranks, which continue at the index the W stopped at with
no batch skipped or trained twice. Each rank reads and cuts all W ranks' batches, so this
costs reading; masking and collation stay per rank.
"""

from __future__ import annotations

import logging
import queue
from collections import Counter, deque
from typing import Callable, Iterable

import numpy as np
import pyarrow as pa

from vlp.datasets.batching.block_reader import BLOCK, EPOCH_END, ERROR, BlockReader
from vlp.datasets.batching.collate import ExampleRefs
from vlp.datasets.batching.example_window import ExampleWindow
from vlp.datasets.batching.image_block import ImageBlock
from vlp.datasets.batching.window_collate import collate_window
from vlp.datasets.stream.data_plan import DataPlan

log = logging.getLogger(__name__)


class BatchStream:
    """The batches of example references a rank's block stream cuts, in order, with their
    epochs (see the module docstring); ``PretrainBatches`` masks them for a task."""

    def __init__(self, plan: DataPlan, blocks: Callable[[int], Iterable[pa.Table]], *,
                 rank: int = 0, epoch_sync: Callable[[bool], bool] | None = None,
                 world_size: int = 1, global_order: bool = False):
        self.plan = plan
        self.cfg = plan.config
        self.global_order = global_order
        if global_order and epoch_sync is not None:
            raise ValueError("a global stream has no epoch sync: every rank reads the whole "
                             "stream and no rank waits for another at an epoch's end")
        # the global stream is seeded as one worker's (rank 0): the same on any world
        self.rank = 0 if global_order else rank
        self.take_rank, self.take_world = rank, world_size
        self._index = 0                # global: batches of the stream taken or passed over
        self._next_own = rank          # global: the index of this rank's next batch
        self._cut_index = 0            # global: the index the next batch cut will have
        self._blocks_fn = blocks
        self._sync = epoch_sync     # (this rank's epoch exhausted) → whether any rank's is
        self.window = ExampleWindow(plan, self._window_rng(0))
        self.stats: Counter = Counter()
        self.epoch = 0                 # the epoch of the last batch served
        self.served_in_epoch = 0       # batches of ``epoch`` served so far
        self._skip = 0                 # restored: batches of ``epoch`` to pass over
        self._ended = -1               # the last epoch whose end the stream has delivered
        self._reader: BlockReader | None = None
        self._live: dict[int, ImageBlock] = {}
        self._next_block_id = 0
        # (batch, its unmasked arrays (region input) or None, its epoch)
        self._ready: deque[tuple[ExampleRefs, dict | None, int]] = deque()
        self._reading_epoch = 0
        self._epoch_examples = 0
        self._warned_sources: set = set()
        self._batch_key: list[int] = []   # the last batch's generator key (_take)

    @property
    def block_source(self) -> Callable[[int], Iterable[pa.Table]]:
        """``blocks(epoch)``, the stream this reads."""
        return self._blocks_fn

    def _start(self) -> None:
        plan = self.plan

        def to_block(t: pa.Table) -> ImageBlock:
            return ImageBlock.from_table(t, plan.feature_dim, plan.num_classes, plan.loc_dim)

        self._reader = BlockReader(self._blocks_fn, to_block, self.cfg.prefetch_blocks,
                                   self.epoch)
        self._reader.start()

    def _window_rng(self, epoch: int) -> np.random.Generator:
        return np.random.default_rng([self.cfg.seed, self.rank, 0x5EED, epoch])

    def _take_synced(self) -> tuple[ExampleRefs, dict[int, ImageBlock], np.random.Generator,
                                    dict | None]:
        """``_take`` after a restore's skipping and the ranks' epoch agreement; in a global
        stream, this rank's next batch (the others' passed over)."""
        self._skip_served()
        if self.global_order:
            while self._index < self._next_own:
                self._take()
                self._index += 1
            taken = self._take()    # may cut a window: it collates from _next_own on
            self._index += 1
            self._next_own += self.take_world
            return taken
        if self._sync is not None and self._sync(self._epoch_exhausted()):
            self.stats["epoch_tail_dropped"] += self._finish_epoch()
        return self._take()

    def _take(self) -> tuple[ExampleRefs, dict[int, ImageBlock], np.random.Generator,
                             dict | None]:
        """The next batch's refs, the blocks they index, the generator for its ITM
        negatives and masking (keyed by the batch's place in its epoch) and its collated
        arrays if the window collated it."""
        refs, blocks, epoch, collated = self._next_refs()
        if epoch != self.epoch:
            self.epoch, self.served_in_epoch = epoch, 0
        self._batch_key = [self.cfg.seed, self.rank, 0xBA7C, epoch, self.served_in_epoch]
        rng = np.random.default_rng(self._batch_key)
        self.served_in_epoch += 1
        return refs, blocks, rng, collated

    def _skip_served(self) -> None:
        """After a restore: pass over the batches of the epoch served before the checkpoint
        (formed again, since the window depends on everything read before, but not
        collated or masked)."""
        while self._skip:
            epoch = self.epoch
            self._take()
            if self.epoch != epoch:
                raise RuntimeError(
                    f"cannot resume the data stream exactly: epoch {epoch} now has fewer "
                    f"batches than the {self.served_in_epoch + self._skip} served before the "
                    f"checkpoint (the data, seed or number of workers changed?)")
            self._skip -= 1
            self.stats["resume_skipped"] += 1

    def _epoch_exhausted(self) -> bool:
        """Whether every batch of ``epoch`` has been served. Reads this rank's stream up to
        the epoch's end if need be, never past it: at a streaming split the next epoch
        starts only when every rank asks for it."""
        if self._reader is None:
            self._start()
        while not self._ready:
            if self._ended >= self.epoch:
                return True
            self._pull()
        return self._ready[0][2] != self.epoch

    def _finish_epoch(self) -> int:
        """End ``epoch`` here: read its stream to the end and drop its batches not served,
        so that the next batch is the next epoch's first. Returns the batches dropped."""
        while self._ended < self.epoch:
            self._pull()
        dropped = sum(1 for *_, e in self._ready if e == self.epoch)
        self._ready = deque(item for item in self._ready if item[2] != self.epoch)
        self.epoch += 1
        self.served_in_epoch = 0
        return dropped

    def _next_refs(self) -> tuple[ExampleRefs, dict[int, ImageBlock], int, dict | None]:
        """The next batch's refs, the blocks they index, its epoch and its collated arrays
        (None: collated when taken)."""
        if self._reader is None:
            self._start()
        while not self._ready:
            self._pull()
        refs, collated, epoch = self._ready.popleft()
        return refs, self._live, epoch, collated

    def _pull(self, timeout: float | None = None) -> bool:
        """Take one item from the reader (blocks, epoch ends); False if none came within
        ``timeout`` seconds."""
        try:
            kind, payload, extra = self._reader.queue.get(timeout=timeout)
        except queue.Empty:
            return False
        if kind == ERROR:
            raise RuntimeError(f"reading the data stream failed: {payload!r}") from payload
        if kind == BLOCK:
            self._reading_epoch = extra
            self._ingest(payload)
            if self.window.pending_examples >= self.cfg.bucket_window:
                self._cut(final=False)
        elif kind == EPOCH_END:
            self._cut(final=True)
            self._end_epoch(payload)
        return True

    def _ingest(self, block: ImageBlock) -> None:
        bid = self._next_block_id
        self._next_block_id += 1
        self._live[bid] = block
        self._epoch_examples += self.window.ingest(bid, block)
        self.stats["images"] += block.num_images
        self.stats["overlong_dropped"] += block.n_overlong
        self.stats["overlong_truncated"] += block.n_truncated
        self.stats["region_fallback_images"] += block.n_fallback
        if block.has_image_feature is not None and not block.has_image_feature.all():
            self._warn_no_whole_image(block)

    def _warn_no_whole_image(self, block: ImageBlock) -> None:
        """Once per source: some of its images have no whole-image RoI (VL-BERT)."""
        missing = block.source_index[~block.has_image_feature]
        self.stats["whole_image_missing"] += len(missing)
        for i in np.unique(missing):
            name = self.plan.sources[int(i)].name if int(i) < len(self.plan.sources) else i
            if name not in self._warned_sources:
                self._warned_sources.add(name)
                log.warning("source %s: images without a whole-image RoI feature (null "
                            "image_feature): their text tokens and [END] get the mean of the "
                            "image's region features instead", name)

    def _cut(self, final: bool) -> None:
        if self.cfg.visual == "regions":
            self._cut_regions(final)
            return
        merged_id = self._next_block_id
        self._next_block_id += 1
        batches, merged = self.window.cut(self._live, final, merged_id)
        if merged is None:
            return
        # batches and carried items now refer only to the merged window block: release the
        # blocks it was gathered from (older windows stay alive while their batches queue)
        self._live = {b: blk for b, blk in self._live.items()
                      if b in self.window.referenced_blocks()
                      or any(b == r.image_block[0] for r, *_ in self._ready)}
        self._live[merged_id] = merged
        self._ready.extend((b, None, self._reading_epoch) for b in batches)

    def _cut_regions(self, final: bool) -> None:
        """Region input: the window's batches are collated here, straight from the blocks
        they were read from; after that only the carried items need blocks, so the others are
        released. The queue then holds one window's collated batches (~``bucket_window`` pairs ×
        padded regions × D × 2 bytes: ~25 MB at D=256, ~200 MB at D=2048 on the demo world) instead
        of its images once."""
        batches = self.window.cut_refs(self._live, final)
        plan = self.plan
        own = list(range(len(batches)))
        if self.global_order:   # other ranks' batches are passed over: not collated
            first = self._cut_index
            self._cut_index += len(batches)
            own = [i for i in own if first + i >= self._next_own
                   and (first + i - self._next_own) % self.take_world == 0]
        made = collate_window(self._live, [batches[i] for i in own], self.tok,
                              feature_dim=plan.feature_dim, need_soft=plan.needs_soft_labels)
        collated: list[dict | None] = [None] * len(batches)
        for i, c in zip(own, made):
            collated[i] = c
        self._ready.extend((b, c, self._reading_epoch) for b, c in zip(batches, collated))
        carried = self.window.referenced_blocks()
        self._live = {b: blk for b, blk in self._live.items() if b in carried}

    # ---- the global stream's position ------------------------------------------------------

    def _global_state(self) -> dict[str, int]:
        return {"index": self._index, "next": self._next_own, "world": self.take_world}

    def _load_global(self, state: dict, served_in_epoch: int) -> None:
        """After the epoch position is restored: the global index and this rank's next; the
        reader restarts at the epoch's first batch, which had index ``index - served``."""
        self._index, self._next_own = int(state["index"]), int(state["next"])
        self._cut_index = self._index - served_in_epoch

    def _end_epoch(self, epoch: int) -> None:
        if self._epoch_examples == 0:
            raise RuntimeError(
                f"rank {self.rank} received no examples in epoch {epoch}: the shard is empty "
                f"(fewer images than workers, no captions in split {self.cfg.split!r}, or "
                f"all source weights 0)")
        log.info("rank %d read epoch %d: %s", self.rank, epoch, dict(self.stats))
        self._epoch_examples = 0
        self._ended = epoch
        self.window.rng = self._window_rng(epoch + 1)   # nothing is carried across epochs


__all__ = ["BatchStream"]
