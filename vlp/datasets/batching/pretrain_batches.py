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

The stream under it (the reader thread, the window, epoch ends and exact resume) is
``batch_stream.BatchStream``.
"""

from __future__ import annotations

import copy
from collections import Counter
from typing import Any, Callable, Iterable, Mapping

import numpy as np
import pyarrow as pa
import torch

from vlp.contract import batch_spec as K
from vlp.datasets.batching.batch_stream import BatchStream
from vlp.datasets.batching.fixed_shapes import ShapeSet
from vlp.datasets.batching.summed_batch import summed_batch
from vlp.datasets.batching.task_batch import mask_context, task_batch
from vlp.datasets.batching.text_corpus import TextCorpusBatches
from vlp.datasets.stream.data_plan import DataPlan
from vlp.datasets.stream.text_tokenizer import load_tokenizer
from vlp.tasks import get_task, visual_problem


class PretrainBatches(BatchStream):
    def __init__(self, plan: DataPlan, blocks: Callable[[int], Iterable[pa.Table]], *,
                 rank: int = 0, with_ids: bool = False,
                 epoch_sync: Callable[[bool], bool] | None = None, world_size: int = 1,
                 global_order: bool = False):
        self._with_ids = with_ids   # add example_image_key / example_text_key (evaluation, tests)
        self.tok = load_tokenizer(plan.tokenizer_path or None)
        self.ctx = mask_context(plan, self.tok)
        # global_order: ``blocks`` is the whole stream, and this rank trains every
        # world_size-th batch of it (``batch_stream``: resumable on another world)
        super().__init__(plan, blocks, rank=rank, epoch_sync=epoch_sync,
                         world_size=world_size, global_order=global_order)
        self.text: TextCorpusBatches | None = None   # mlm-text's own stream (VL-BERT)
        if any(get_task(t).text_only for t in plan.tasks):
            self.text = TextCorpusBatches(
                self.cfg.text_corpus, self.tok, self.ctx, max_text_len=self.cfg.max_text_len,
                batch_units=self.cfg.batch_units, batch_examples=self.cfg.batch_examples,
                feature_dim=plan.feature_dim,
                loc_dim=plan.loc_dim, seed=self.cfg.seed, rank=rank, world_size=world_size,
                fixed_width=self.cfg.max_text_len + 2 if self.cfg.fixed_shapes else 0,
                mask_prob=self.cfg.mask_prob)

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
                 "stats": dict(self.stats),
                 # the checkpoint's meta records it: a driver refuses a per-worker
                 # position on another number of workers before any worker starts
                 "stream": "global" if self.global_order else "per_worker"}
        if self.text is not None:
            state["text"] = self.text.state_dict()
        if self.window.shapes is not None:
            state["shapes"] = self.window.shapes.state_dict()
        if self.global_order:
            state["global"] = self._global_state()
        return state

    @property
    def reshardable(self) -> bool:
        """Whether ``load_resharded_state`` can move the position to another world."""
        return self.global_order

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if self._reader is not None:
            raise RuntimeError("load_state_dict must come before the first next()")
        if ("global" in state) != self.global_order:
            saved, mine = [("global" if g else "per_worker") for g in
                           ("global" in state, self.global_order)]
            raise ValueError(f"the checkpoint's batch stream was data.stream: {saved}, this "
                             f"run's is {mine}: resume with data.stream: {saved}, or start a "
                             f"new run beside it with a new run.name (--name)")
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
        if self.global_order:
            self._load_global(state["global"], self._skip)

    def load_resharded_state(self, states: list[Mapping[str, Any]], saved_world: int) -> None:
        """Continue a global stream saved by ``saved_world`` ranks (their states, by rank) on
        this rank of another world: they stood at one cursor (rank r's next batch at cursor +
        r, at a step boundary), so this rank's next is cursor + its rank; the stream is
        restored at the earliest saved position (rank 0's) and passes over from there."""
        if not self.global_order or any("global" not in s for s in states):
            raise ValueError(f"the checkpoint's batch stream was written by {saved_world} "
                             f"workers each batching its own share (data.stream: per_worker), "
                             f"which cannot move to {self.take_world}: resume on {saved_world} "
                             f"workers (scaling.num_workers={saved_world})")
        cursors = {int(s["global"]["next"]) - r for r, s in enumerate(states)}
        if len(states) != saved_world or len(cursors) != 1:
            raise ValueError(f"the checkpoint's {len(states)} stream positions (next batches "
                             f"{[s['global']['next'] for s in states]}) are not one position "
                             f"of {saved_world} workers")
        self.load_state_dict(min(states, key=lambda s: int(s["global"]["index"])))
        self._next_own = cursors.pop() + self.take_rank

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


__all__ = ["PretrainBatches"]
