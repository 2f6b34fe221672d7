"""``PretrainBatches``: per-task batches for a train loop, from any stream of image blocks.

The train loop draws the task of the step (``TaskSampler``, the same on every rank) and asks
for a batch masked for it::

    batches = PretrainBatches(plan, blocks)      # blocks(epoch) → iterator of Arrow tables
    task = sampler.next()
    batch = batches.next(task)                   # dict[str, torch.Tensor], see batch_spec

Under the ``summed`` objective the loop passes every task at once (a ``TaskSet``) and gets
one example set with a batch per task (``summed_batch``)::

    batch = batches.next(SummedTasks(mix).next())   # {TASK_BATCHES: {task: batch}, ...}

``blocks`` comes from a Ray Data shard (``vlp.datasets.stream.pipeline.shard_blocks``) or from the
plain local reader (``vlp.datasets.stream.local_stream.local_batches``). Batches are formed before
the task is known (bucketing by input units does not depend on it); the task decides the ITM
negatives, the masking and which targets are decoded.

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
"""

from __future__ import annotations

import copy
import logging
import queue
from collections import Counter, deque
from typing import Any, Callable, Iterable, Mapping

import numpy as np
import pyarrow as pa
import torch

from vlp.contract import batch_spec as K
from vlp.datasets.batching.block_reader import BLOCK, EPOCH_END, ERROR, BlockReader
from vlp.datasets.batching.collate import ExampleRefs
from vlp.datasets.batching.example_window import ExampleWindow
from vlp.datasets.batching.fixed_shapes import ShapeSet
from vlp.datasets.batching.image_block import ImageBlock
from vlp.datasets.batching.summed_batch import summed_batch
from vlp.datasets.batching.task_batch import mask_context, task_batch
from vlp.datasets.batching.text_corpus import TextCorpusBatches
from vlp.datasets.batching.window_collate import collate_window
from vlp.datasets.stream.data_plan import DataPlan
from vlp.datasets.stream.text_tokenizer import load_tokenizer
from vlp.tasks import get_task, visual_problem

log = logging.getLogger(__name__)


class PretrainBatches:
    def __init__(self, plan: DataPlan, blocks: Callable[[int], Iterable[pa.Table]], *,
                 rank: int = 0, with_ids: bool = False,
                 epoch_sync: Callable[[bool], bool] | None = None, world_size: int = 1):
        self.plan = plan
        self.cfg = plan.config
        self.rank = rank
        self._blocks_fn = blocks
        self._sync = epoch_sync     # (this rank's epoch exhausted) → whether any rank's is
        self._with_ids = with_ids   # add example_image_key / example_text_key (evaluation, tests)
        self.tok = load_tokenizer(plan.tokenizer_path or None)
        self.ctx = mask_context(plan, self.tok)
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
        self.text: TextCorpusBatches | None = None   # mlm-text's own stream (VL-BERT)
        if any(get_task(t).text_only for t in plan.tasks):
            self.text = TextCorpusBatches(
                self.cfg.text_corpus, self.tok, self.ctx, max_text_len=self.cfg.max_text_len,
                batch_units=self.cfg.batch_units, batch_examples=self.cfg.batch_examples,
                feature_dim=plan.feature_dim,
                loc_dim=plan.loc_dim, seed=self.cfg.seed, rank=rank, world_size=world_size)

    # ---- the train loop's API ---------------------------------------------------------------

    def next(self, task: str | tuple[str, ...]) -> dict[str, torch.Tensor]:
        """The next batch, masked for ``task``; for a tuple of tasks (the ``summed``
        objective), the next example set with a batch per task (``summed_batch``)."""
        if isinstance(task, tuple):
            return self._next_summed(task)
        policy = get_task(task)
        problem = visual_problem(task, self.cfg.visual, "the pipeline")
        if problem:
            raise ValueError(problem)
        if policy.text_only:
            return self._text_batch(task)
        refs, blocks, rng, collated = self._take_synced()
        batch = task_batch(self.plan, self.tok, self.ctx, blocks, refs, task, rng,
                           self.stats, with_ids=self._with_ids, collated=collated,
                           shapes=self.window.shapes)
        self.stats["batches"] += 1
        self.stats["examples"] += int(batch[K.NUM_EXAMPLES])
        self.stats["input_units"] += int(batch[K.INPUT_UNITS])
        return batch

    def _next_summed(self, tasks: tuple[str, ...]) -> dict:
        for task in tasks:
            problem = visual_problem(task, self.cfg.visual, "the pipeline")
            if problem:
                raise ValueError(problem)
        refs, blocks, rng, collated = self._take_synced()
        key = self._batch_key   # each task's generator: the set's key and the task's place
        batch = summed_batch(self.plan, self.tok, self.ctx, blocks, refs, tasks,
                             lambda i: np.random.default_rng([*key, 1 + i]), self.stats,
                             with_ids=self._with_ids, collated=collated,
                             text_only=self._text_batch, shapes=self.window.shapes)
        self.stats["batches"] += 1
        self.stats["examples"] += int(batch[K.NUM_EXAMPLES])
        self.stats["input_units"] += int(batch[K.INPUT_UNITS])
        return batch

    def pass_over(self, task: str | tuple[str, ...]) -> None:
        """Advance past the next batch without building it: what ``next(task)`` would do to
        the stream (the window, the epoch sync, the text corpus), none of the masking and
        gathering. Several builder processes (``training.builder_pool.BuilderPool``) each
        build every n-th batch and pass over the others: their batches are the batches of
        one. ``stats`` count the batches built here."""
        if not isinstance(task, tuple):
            if get_task(task).text_only:
                self._text_batch(task)   # its own stream: built, and dropped
            else:
                self._take_synced()
            return
        self._take_synced()
        forwards = task.forwards() if hasattr(task, "forwards") else [(t,) for t in task]
        for group in forwards:   # as summed_batch draws them
            if get_task(group[0]).text_only:
                self._text_batch(group[0])

    def _text_batch(self, task: str) -> dict[str, torch.Tensor]:
        if self.text is None:
            raise ValueError(f"task {task!r} reads the text corpus; this loader was "
                             f"planned for tasks {list(self.plan.tasks)}")
        self.stats["text_only_batches"] += 1
        return self.text.next()

    def __iter__(self):
        raise TypeError("PretrainBatches needs the task of each step: call next(task) with "
                        "the task your TaskSampler drew (or use iterate(sampler))")

    def iterate(self, sampler) -> Iterable[tuple[str, dict[str, torch.Tensor]]]:
        """(task, batch) forever, the task drawn from ``sampler``."""
        while True:
            task = sampler.next()
            yield task, self.next(task)

    def state_dict(self) -> dict[str, Any]:
        """Where the stream stands: the epoch of the last batch served and how many of its
        batches were served. A Ray Data stream cannot seek: a restored loader reads that
        epoch from its start and passes over those batches (see the module docstring)."""
        state = {"epoch": self.epoch, "served_in_epoch": self.served_in_epoch,
                 "stats": dict(self.stats)}
        if self.text is not None:
            state["text"] = self.text.state_dict()
        if self.window.shapes is not None:
            state["shapes"] = self.window.shapes.state_dict()
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if self._reader is not None:
            raise RuntimeError("load_state_dict must come before the first next()")
        self.epoch = self._reading_epoch = int(state["epoch"])
        self._ended = self.epoch - 1
        self.served_in_epoch = 0
        self._skip = int(state.get("served_in_epoch", 0))
        self.stats = Counter(state.get("stats", {}))
        self.window.rng = self._window_rng(self.epoch)
        if state.get("shapes") is not None:   # the shapes fitted before, not refitted
            self.window.shapes = ShapeSet.from_state(state["shapes"])
        if self.text is not None and "text" in state:
            self.text.load_state_dict(state["text"])

    def split_io(self) -> tuple[PretrainBatches, Callable[[int], Iterable[pa.Table]],
                                Callable[[bool], bool] | None]:
        """For building batches in another process (``training.batch_process``): a copy of
        this loader without its epoch sync and its block stream, to pickle, and those two,
        which stay in this process (a stream that ``reads_anywhere``, e.g. the local reader,
        goes with the copy: None here). Before the first ``next``."""
        if self._reader is not None:
            raise RuntimeError("split_io must come before the first next()")
        bare = copy.copy(self)
        blocks = self._blocks_fn
        if getattr(blocks, "reads_anywhere", False):
            blocks = None
        else:
            bare._blocks_fn = None
        bare._sync = None
        return bare, blocks, self._sync

    def attach_io(self, blocks: Callable[[int], Iterable[pa.Table]] | None,
                  epoch_sync: Callable[[bool], bool] | None) -> None:
        """The other process's side of ``split_io``: relays to the stream (None: the copy
        kept its own) and the epoch sync."""
        if blocks is not None:
            self._blocks_fn = blocks
        self._sync = epoch_sync

    def close(self, timeout: float = 2.0) -> None:
        """Stop the reader thread (waits up to ``timeout`` s: call before ``ray.shutdown``,
        or a reader still inside a Ray iterator logs errors as Ray goes away)."""
        if self._reader is not None:
            self._reader.stop()
            while not self._reader.queue.empty():   # unblock a reader waiting to put
                self._reader.queue.get_nowait()
            self._reader.join(timeout)

    # ---- the stream ---------------------------------------------------------------------------

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
        """``_take`` after a restore's skipping and the ranks' epoch agreement."""
        self._skip_served()
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
        collated = collate_window(self._live, batches, self.tok,
                                  feature_dim=plan.feature_dim,
                                  need_soft=plan.needs_soft_labels)
        self._ready.extend((b, c, self._reading_epoch) for b, c in zip(batches, collated))
        carried = self.window.referenced_blocks()
        self._live = {b: blk for b, blk in self._live.items() if b in carried}

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


__all__ = ["PretrainBatches"]
