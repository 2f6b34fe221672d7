"""The training loop's input path: micro-batches built ahead of the step on a thread.

The task sequence is deterministic (the sampler is seeded identically on every rank), so the
next micro-batches can be drawn and built — masking, collation, ITM swaps — while the device
runs the current step. Each item remembers the sampler and batch-source state from before it
was drawn: a checkpoint saves the state of the first item not yet consumed, so a resumed run
draws exactly the batches that the synchronous loop would have drawn.

How far ahead the thread may go is set by the loop on every ``next(still_needed)``: at most
``depth`` items, and never past the micro-batches the stage still needs. Every rank passes
the same numbers, so every rank's thread draws the same batches; a batch source whose
``next`` makes a collective (``PretrainBatches``' epoch sync) makes the same collectives on
every rank, on a process group of its own (see ``pretrain_components.AnyRank``).

With ``builder="process"`` the batches are drawn and built in a process of their own
(``batch_process``: no GIL shared with the step's dispatching) and the thread here only
receives them and copies them to the device; each comes with the sampler and source state
after its draw, so the resume point is the same. ``builders`` > 1 builds them in that many
processes, each every n-th batch (``builder_pool.BuilderPool``): the same batches.

On CUDA, host tensors are pinned on the thread and copied on a side stream; the consumer's
stream waits for that copy with an event, not with a host sync. Bookkeeping scalars
(examples, input units) are read on the host, before any copy.
"""

from __future__ import annotations

import collections
import contextlib
import copy
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from vlp.platform.training.batch_process import BuilderProcess
from vlp.platform.training.builder_pool import AutoGrow, BuilderPool, builder
from vlp.platform.training.packed_batch import unpack

BUILDERS = ("thread", "process")
NUM_EXAMPLES, INPUT_UNITS = "num_examples", "input_units"   # vlp/contract/batch_spec.py
REAL_UNITS = "real_units"
BOOKKEEPING_KEYS = (NUM_EXAMPLES, INPUT_UNITS, REAL_UNITS)
HOST_INTS = ("row_length", REAL_UNITS)   # batch_spec.HOST_INTS: to the model as Python ints
TASK_BATCHES = "task_batches"   # the summed objective's batch per task (batch_spec)


@dataclass
class Prefetched:
    task: str | tuple[str, ...]      # a tuple: every task on one example set (summed objective)
    batch: dict[str, Any]            # on the loop's device, floating tensors in its dtype
    examples: int                    # host integers: no device read to count them
    input_units: int
    # forward passes' input units per input unit counted (summed objective: every task's
    # batch of the set runs through the model; 1 otherwise): for the model FLOPs
    passes: float = 1.0
    # input units that are not padding, per forward pass (MFU on real tokens); the padded
    # count where the batch does not say
    real_units: float = 0.0
    before: dict[str, Any] = field(repr=False, default_factory=dict)   # states before drawing
    ready: Any = field(repr=False, default=None)   # CUDA event of the copy, else None


class Prefetcher:
    """``next(still_needed)`` → the next ``Prefetched`` micro-batch. ``depth`` = 0 builds it
    on the caller's thread (the synchronous input path, same batches); otherwise ``builder``
    builds ahead on a thread or in a process (same batches)."""

    def __init__(self, sampler: Any, source: Any, *, depth: int, device: torch.device,
                 dtype: torch.dtype = torch.float32, builder: str = "thread",
                 builders: int | str = 1):
        if builder not in BUILDERS:
            raise ValueError(f"builder {builder!r}: expected one of {BUILDERS}")
        self.sampler, self.source = sampler, source
        self.depth, self.device, self.dtype = depth, device, dtype
        self.builder = builder if depth > 0 else "thread"
        if self.builder == "process":
            BuilderProcess.check_sendable(sampler, source)
        # processes (builder="process"): a BuilderPool if > 1; "auto": grown while the loop
        # waits (builder_pool.AutoGrow)
        self.builders = builders
        self._grow: AutoGrow | None = None
        self._last_next: float | None = None
        self._process: BuilderProcess | BuilderPool | None = None
        self._next_before: dict[str, Any] | None = None   # process: states before the next
        self.cuda = device.type == "cuda"
        self._stream = torch.cuda.Stream(device) if self.cuda and depth > 0 else None
        self._cond = threading.Condition()
        self._queue: collections.deque[Prefetched] = collections.deque()
        self._building: dict[str, Any] | None = None   # states before the item in the making
        self._target = 0          # items the thread may have produced in all
        self._produced = self._consumed = 0
        self._error: BaseException | None = None
        self._stop = False
        self._thread: threading.Thread | None = None
        self.wait_s = 0.0         # time the consumer spent waiting for a batch

    # ---- the consumer (the training loop) -------------------------------------------------

    def next(self, still_needed: int = 0) -> Prefetched:
        """The next micro-batch; ``still_needed``: how many more the loop will take after this
        one in the current stage if nothing is dropped (bounds the look-ahead)."""
        t0 = time.perf_counter()
        if self.depth == 0:
            item = self._build(self._snapshot())
        else:
            item = self._take(still_needed)
        if item.ready is not None:
            stream = torch.cuda.current_stream(self.device)
            stream.wait_event(item.ready)
            for v in _tensors(item.batch):
                if v.is_cuda:
                    v.record_stream(stream)   # the copy stream's memory now serves this one
        self._consumed += 1
        now = time.perf_counter()
        self.wait_s += now - t0
        if self._grow is not None and self._last_next is not None:
            self._grow.record(now - t0, now - self._last_next)
        self._last_next = now
        return item

    def state_dict(self) -> dict[str, Any]:
        """``{"sampler", "source"}`` as they were before the first batch not yet consumed."""
        with self._cond:
            if self._queue:
                return copy.deepcopy(self._queue[0].before)
            if self._building is not None:
                return copy.deepcopy(self._building)
            if self._next_before is not None:   # the builder process's, after its last draw
                return copy.deepcopy(self._next_before)
            return self._snapshot()

    def close(self, timeout: float = 120.0) -> None:
        """Stop the thread after the batch it is building (a batch source's collective must
        finish on every rank)."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if self._process is not None:
            self._process.close(timeout)
        if self._thread is not None:
            self._thread.join(timeout)

    # ---- the thread -----------------------------------------------------------------------

    def _take(self, still_needed: int) -> Prefetched:
        with self._cond:
            # a pool's active builders each build one ahead
            ahead = max(self.depth, getattr(self._process, "active", 1))
            self._target = max(self._target, self._consumed + 1 + min(ahead, still_needed))
            if self._thread is None:
                self._start()
            if self._process is not None:
                self._process.set_target(self._target)
            self._cond.notify_all()
            while not self._queue and self._error is None:
                self._cond.wait()
            if self._error is not None and not self._queue:
                raise RuntimeError(f"the batch prefetch {self.builder} failed") from self._error
            item = self._queue.popleft()
            self._cond.notify_all()
            return item

    def _start(self) -> None:
        target = self._run
        if self.builder == "process":
            self._next_before = self._snapshot()
            self._process = builder(self.sampler, self.source, self.builders)
            if self.builders == "auto":
                self._grow = AutoGrow(self._process)
            self._process.start()
            target = self._relay
        self._thread = threading.Thread(target=target, name="vlp-prefetch", daemon=True)
        self._thread.start()

    def _relay(self) -> None:
        """The process builder's items, to the device and into the queue."""
        try:
            while True:
                got = self._process.receive()
                if got is None:
                    return
                task, buffer, slot, layout, after = got
                with self._cond:
                    before = self._building = self._next_before
                    self._next_before = after
                # one copy out of the builder's buffer, which it may then reuse: into pinned
                # memory on CUDA (views of it go to the device)
                own = buffer.pin_memory() if self.cuda else buffer.clone()
                self._process.release(slot)
                self._deliver(self._finish(task, unpack(own, layout), before))
        except BaseException as e:
            self._fail(e)

    def _run(self) -> None:
        try:
            while True:
                with self._cond:
                    while not self._stop and self._produced >= self._target:
                        self._cond.wait()
                    if self._stop:
                        return
                    before = self._building = self._snapshot()
                self._deliver(self._build(before))
        except BaseException as e:
            self._fail(e)

    def _deliver(self, item: Prefetched) -> None:
        with self._cond:
            self._queue.append(item)
            self._produced += 1
            self._building = None
            self._cond.notify_all()

    def _fail(self, error: BaseException) -> None:
        """Hand ``error`` to the consumer, which raises it."""
        with self._cond:
            self._error = error
            self._building = None
            self._cond.notify_all()

    def _snapshot(self) -> dict[str, Any]:
        return copy.deepcopy({"sampler": self.sampler.state_dict(),
                              "source": self.source.state_dict()})

    def _build(self, before: dict[str, Any]) -> Prefetched:
        task = self.sampler.next()
        return self._finish(task, self.source.next(task), before)

    def _finish(self, task: Any, host: dict[str, Any], before: dict[str, Any]) -> Prefetched:
        examples = (int(host[NUM_EXAMPLES]) if NUM_EXAMPLES in host
                    else _leading_dim(host))
        units = int(host[INPUT_UNITS]) if INPUT_UNITS in host else 0
        passes = 1.0
        real = float(host[REAL_UNITS]) if REAL_UNITS in host else float(units)
        if TASK_BATCHES in host and units:
            parts = [b for b in host[TASK_BATCHES].values() if INPUT_UNITS in b]
            passes = sum(int(b[INPUT_UNITS]) for b in parts) / units
            real = sum(int(b.get(REAL_UNITS, b[INPUT_UNITS])) for b in parts) / passes
        batch, ready = self._to_device(host)
        return Prefetched(task, batch, examples, units, passes, real_units=real, before=before,
                          ready=ready)

    def _to_device(self, host: dict[str, Any]) -> tuple[dict[str, Any], Any]:
        if self.device.type == "cpu":
            return self._copy(host), None
        stream = self._stream
        with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
            out = self._copy(host)
            ready = None
            if stream is not None:
                ready = torch.cuda.Event()
                ready.record(stream)
        return out, ready

    def _copy(self, host: dict[str, Any]) -> dict[str, Any]:
        """To the device and dtype; a nested dict (the summed objective's batch per task,
        ``TASK_BATCHES``) likewise."""
        out: dict[str, Any] = {}
        for k, v in host.items():
            if isinstance(v, dict):
                v = self._copy(v)
            elif k in HOST_INTS and isinstance(v, torch.Tensor):
                v = int(v)   # a host tensor: the model packs to it without reading the device
            elif isinstance(v, torch.Tensor) and k not in BOOKKEEPING_KEYS:
                if self.cuda and not v.is_pinned():
                    v = v.pin_memory()
                v = self._cast(k, v.to(self.device, non_blocking=True))
            out[k] = v
        return out

    def _cast(self, key: str, v: Any) -> Any:
        if (isinstance(v, torch.Tensor) and v.is_floating_point() and v.dtype != self.dtype
                and key not in BOOKKEEPING_KEYS):
            return v.to(self.dtype)
        return v


def _leading_dim(batch: dict[str, Any]) -> int:
    for v in batch.values():
        if isinstance(v, torch.Tensor) and v.ndim > 0:
            return int(v.shape[0])
    return 0


def _tensors(batch: dict[str, Any]):
    for v in batch.values():
        if isinstance(v, dict):
            yield from _tensors(v)
        elif isinstance(v, torch.Tensor):
            yield v
