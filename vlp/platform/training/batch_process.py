"""Batches built in a process of their own, beside the training process.

Building a batch (windows, masking, ITM negatives, collation) is Python and numpy work. On a
thread of the training process it holds the GIL between the main thread's operator
dispatches, and on a GPU the dispatching host is what bounds the step (docs/gpu-check.md). In
a separate process it runs on a core of its own; the training process keeps three threads that
sleep in ``recv`` with the GIL released:

- **items**: the built batches come back in shared-memory buffers (``packed_batch``), which
  the builder reuses once they are copied out here, with the sampler and source state after
  each draw (exact resume);
- **blocks**: the Arrow blocks of the run's stream. The stream stays here: a Ray Data shard
  iterator belongs to the worker that Ray Train gave it to. The builder asks for an epoch,
  and the blocks follow, each written once into shared memory (``ipc_tables``);
- **epoch sync**: a source whose epoch end is agreed across ranks (``PretrainBatches``'
  ``epoch_sync``, a collective) asks here, and the collective runs in the training process,
  on the group it was built with.

The look-ahead stays the loop's: the builder draws only up to the target the prefetcher sets
(``set_target``), so every rank draws, and syncs, the same batches.

The process is started with ``spawn`` (the training process has CUDA and threads, which
``fork`` does not carry safely); it imports vlp and torch, a few seconds once per stage.
"""

from __future__ import annotations

import copy
import logging
import multiprocessing as mp
import os
import pickle
import threading
import time
import traceback
from multiprocessing.connection import Connection
from multiprocessing.reduction import ForkingPickler
from typing import Any, Callable, Iterator

import pyarrow as pa
import torch
import torch.multiprocessing  # noqa: F401  (tensors then pickle as shared memory, not bytes)

from vlp.platform.training.ipc_tables import receive_table, send_table
from vlp.platform.training.packed_batch import Packing
from vlp.platform.training.shared_reads import SharedReads

log = logging.getLogger(__name__)

ITEM, ERROR = "item", "error"
TARGET, STOP, FREE, OWN = "target", "stop", "free", "own"
END = "end"


class BuilderProcess:
    """The training process's side: ``start``, then ``set_target(n)``, ``receive()`` and
    ``release(slot)`` per batch, ``close()``."""

    def __init__(self, sampler: Any, source: Any, *, part: tuple[int, int] = (0, 1),
                 pooled: tuple[bool, bool] | None = None,
                 peers: tuple[dict[int, Connection], dict[int, Connection]] | None = None):
        """``part`` = (k, n): build the batches k, k + n, … and pass over the others (a
        ``BuilderPool``'s member); ``pooled``: the member's source is already split, and
        whether it reads blocks and syncs epochs through the pool (which serves them: the
        member's ends are ``blocks_conn`` and ``sync_conn``); ``peers``: the member's sockets
        to and from the others when they share out the reading of a stream that reads
        anywhere (``shared_reads``)."""
        blocks, sync = None, None
        if pooled is not None:
            has_blocks, has_sync = pooled
        else:
            split = getattr(source, "split_io", None)
            if callable(split):   # the stream and the epoch sync stay in this process
                source, blocks, sync = split()
            has_blocks, has_sync = blocks is not None, sync is not None
        self._payload = (sampler, source, has_blocks, has_sync,
                         logging.getLogger().getEffectiveLevel(), part, peers)
        self._blocks, self._sync = blocks, sync
        self._pooled = pooled
        self.blocks_conn: Connection | None = None
        self.sync_conn: Connection | None = None
        self._proc: mp.process.BaseProcess | None = None
        self._items = self._control = None
        self._stopping = threading.Event()
        self._sent_target = 0
        self._send_lock = threading.Lock()
        self._buffers: dict[int, torch.Tensor] = {}   # the builder's shared buffers by slot

    @staticmethod
    def check_sendable(sampler: Any, source: Any) -> None:
        """Raise a one-line TypeError now if ``start`` could not send the sampler and the
        source to the builder (a set-up error, not a fault to retry)."""
        split = getattr(source, "split_io", None)
        bare = split()[0] if callable(split) else source
        try:
            ForkingPickler.dumps((sampler, bare))
        except (TypeError, AttributeError, pickle.PicklingError) as e:
            raise TypeError(_unsendable(bare, e)) from e

    def start(self) -> None:
        ctx = mp.get_context("spawn")
        items_here, items_there = ctx.Pipe(duplex=False)
        control_there, control_here = ctx.Pipe(duplex=False)
        blocks_here, blocks_there = ctx.Pipe()
        sync_here, sync_there = ctx.Pipe()
        proc = ctx.Process(target=_builder_main, name="vlp-batch-builder", daemon=True,
                           args=(self._payload, items_there, control_there, blocks_there,
                                 sync_there))
        try:
            proc.start()
        except (TypeError, AttributeError, pickle.PicklingError) as e:
            for end in (items_here, items_there, control_there, control_here, blocks_here,
                        blocks_there, sync_here, sync_there):
                end.close()
            raise TypeError(_unsendable(self._payload[1], e)) from e
        self._proc = proc
        for end in (items_there, control_there, blocks_there, sync_there):
            end.close()   # the child holds them: EOF here when it exits
        self._items, self._control = items_here, control_here
        if self._blocks is not None:
            _daemon(self._serve_blocks, blocks_here, "vlp-builder-blocks")
        elif self._pooled is not None and self._pooled[0]:
            self.blocks_conn = blocks_here   # the pool serves it
        else:
            blocks_here.close()
        if self._sync is not None:
            _daemon(self._serve_sync, sync_here, "vlp-builder-sync")
        elif self._pooled is not None and self._pooled[1]:
            self.sync_conn = sync_here
        else:
            sync_here.close()

    def set_target(self, produced_in_all: int) -> None:
        """The builder may have drawn ``produced_in_all`` batches in all (never fewer than
        before)."""
        if produced_in_all > self._sent_target:
            self._sent_target = produced_in_all
            self._send((TARGET, produced_in_all))

    def _send(self, msg: tuple) -> None:
        with self._send_lock:   # the consumer's targets and the relay's releases
            try:
                self._control.send(msg)
            except (BrokenPipeError, ConnectionResetError):
                pass   # the builder has stopped: ``receive`` raises why (its error or exit)

    def receive(self) -> tuple[Any, torch.Tensor, int, dict[str, Any], dict[str, Any]] | None:
        """The next built batch: ``(task, buffer, slot, layout, state_after)``; hand the slot
        back with ``release(slot)`` once the batch is copied out of ``buffer``. None once the
        builder has stopped on ``close``. Raises what the builder raised, or that it died."""
        try:
            msg = self._items.recv()
        except (EOFError, OSError):
            if self._stopping.is_set():
                return None
            self._proc.join(5)
            raise RuntimeError(f"the batch builder process exited unexpectedly (exit code "
                               f"{self._proc.exitcode})") from None
        if msg[0] == ERROR:
            error, text = msg[1], msg[2]
            raise RuntimeError(f"building a batch failed in the batch builder process:\n"
                               f"{text}") from error
        _, task, slot, buffer, size, layout, after = msg
        if buffer is not None:
            self._buffers[slot] = buffer
        return task, self._buffers[slot][:size], slot, layout, after

    def release(self, slot: int) -> None:
        self._send((FREE, slot))

    def close(self, timeout: float = 120.0) -> None:
        """Stop after the batch being built (its epoch sync must finish on every rank), then
        end the process."""
        self._stopping.set()
        if self._proc is None:
            return
        try:
            self._send((STOP,))
        except (OSError, ValueError):
            pass
        self._proc.join(timeout)
        if self._proc.is_alive():
            log.warning("the batch builder process did not stop within %.0f s: terminated",
                        timeout)
            self._proc.terminate()
            self._proc.join(5)
        for conn in (self._items, self._control):
            conn.close()

    # ---- the services the builder calls ----------------------------------------------------

    def _serve_blocks(self, conn: Connection) -> None:
        """Each request ("epoch", e): the blocks of ``blocks(e)`` (``send_table``), then END."""
        while not self._stopping.is_set():
            try:
                _, epoch = conn.recv()
            except (EOFError, OSError):
                return
            try:
                for table in self._blocks(epoch):
                    if self._stopping.is_set():
                        return
                    send_table([conn], table)
                conn.send((END,))
            except (BrokenPipeError, EOFError, OSError):
                return
            except BaseException as e:   # the reading failed: the builder raises it
                try:
                    conn.send((ERROR, _picklable(e), traceback.format_exc()))
                except OSError:
                    return

    def _serve_sync(self, conn: Connection) -> None:
        while True:
            try:
                exhausted = conn.recv()
            except (EOFError, OSError):
                return
            try:
                conn.send(bool(self._sync(exhausted)))
            except OSError:
                return


# ---- the builder's side -----------------------------------------------------------------------


class RemoteBlocks:
    """``blocks(epoch)`` for a source in the builder: the training process reads them."""

    def __init__(self, conn: Connection):
        self.conn = conn

    def __call__(self, epoch: int) -> Iterator[pa.Table]:
        self.conn.send(("epoch", epoch))
        while True:
            msg = self.conn.recv()
            if msg[0] == END:
                return
            if msg[0] == ERROR:
                raise RuntimeError(f"reading the data stream failed in the training "
                                   f"process:\n{msg[2]}") from msg[1]
            yield receive_table(self.conn, msg)


class RemoteSync:
    """``epoch_sync(exhausted)`` for a source in the builder: the collective runs in the
    training process."""

    def __init__(self, conn: Connection):
        self.conn = conn

    def __call__(self, exhausted: bool) -> bool:
        self.conn.send(bool(exhausted))
        return self.conn.recv()


def _builder_main(payload: tuple, items: Connection, control: Connection,
                  blocks: Connection, sync: Connection) -> None:
    sampler, source, has_blocks, has_sync, log_level, part, peers = payload
    logging.basicConfig(level=log_level, format="%(asctime)s %(levelname)s %(name)s "
                        "(batch builder): %(message)s")
    torch.set_num_threads(1)   # one core: the training process keeps the others
    try:
        if peers is not None:   # the pool's members share out the reading
            blocks_here = SharedReads(source.block_source, *part, *peers)
        else:
            blocks_here = RemoteBlocks(blocks) if has_blocks else None
        if blocks_here is not None or has_sync:
            source.attach_io(blocks_here, RemoteSync(sync) if has_sync else None)
        _build_until_stopped(sampler, source, items, control, part)
    except BaseException as e:
        try:
            items.send((ERROR, _picklable(e), traceback.format_exc()))
        except OSError:
            pass
        else:
            _until_stopped(control)
    finally:
        close = getattr(source, "close", None)
        if callable(close):
            close()
        os._exit(0)   # no atexit hook or finaliser may hold the exit (reader threads, pipes)


def _until_stopped(control: Connection, timeout: float = 120.0) -> None:
    """After a failure: wait for the training process's stop (or its end) before exiting.
    A batch sent just before carries a fresh buffer whose file descriptor the training process
    fetches from this process when it takes the batch; exiting at once would refuse it, and
    the training process would report a refused connection instead of the failure."""
    deadline = time.monotonic() + timeout
    try:
        while control.poll(max(0.0, deadline - time.monotonic())):
            if control.recv()[0] == STOP:
                return
    except (EOFError, OSError):
        return


def _build_until_stopped(sampler: Any, source: Any, items: Connection,
                         control: Connection, part: tuple[int, int] = (0, 1)) -> None:
    """Draw up to the target; a pool's member (``part`` = (k, n), n > 1) builds the batches
    the pool gave it (OWN, sent before the target that covers them) and passes over the
    others (``source.pass_over``: the stream moves on as if it had built them, so every
    member's batches are the batches of one builder)."""
    mine, members = part
    produced, target = 0, 0
    slots = _Slots()
    owned: set[int] = set()   # a pool's member: the batches it was given (OWN, before TARGET)

    def handle(msg: tuple) -> bool:
        nonlocal target
        if msg[0] == STOP:
            return False
        if msg[0] == FREE:
            slots.free.append(msg[1])
        elif msg[0] == OWN:
            owned.update(msg[1])
        else:
            target = max(target, msg[1])
        return True

    while True:
        while produced >= target or control.poll():
            if not handle(control.recv()):
                return
        task = sampler.next()
        if members > 1 and produced not in owned:
            source.pass_over(task)
            produced += 1
            continue
        owned.discard(produced)
        host = source.next(task)
        after = copy.deepcopy({"sampler": sampler.state_dict(),
                               "source": source.state_dict()})
        packing = Packing(host)
        slot, buffer, fresh = slots.take(packing.size)
        packing.write(buffer)
        # a buffer travels once (its file descriptor); after that its slot number does
        items.send((ITEM, task, slot, buffer if fresh else None, packing.size, packing.layout,
                    after))
        produced += 1


class _Slots:
    """The builder's shared buffers: one per batch in flight, reused once the training
    process has copied a batch out (``FREE``), replaced by a larger one when a batch does
    not fit."""

    def __init__(self):
        self.buffers: list[torch.Tensor] = []
        self.free: list[int] = []

    def take(self, size: int) -> tuple[int, torch.Tensor, bool]:
        fits = [i for i in self.free if self.buffers[i].numel() >= size]
        if fits:
            slot = min(fits, key=lambda i: self.buffers[i].numel())
            self.free.remove(slot)
            return slot, self.buffers[slot], False
        grown = torch.empty(size + size // 4, dtype=torch.uint8).share_memory_()
        if self.free:   # too small: replaced
            slot = self.free.pop()
            self.buffers[slot] = grown
        else:
            slot = len(self.buffers)
            self.buffers.append(grown)
        return slot, grown, True


# ---- helpers ----------------------------------------------------------------------------------


def _unsendable(source: Any, error: BaseException) -> str:
    return (f"train.batch_builder: process: the task sampler or batch source "
            f"({type(source).__name__}) cannot be sent to another process ({error}); use "
            f"batch_builder: thread")


def _picklable(e: BaseException) -> BaseException:
    """``e`` if it survives pickling, else a RuntimeError with its text."""
    try:
        pickle.loads(pickle.dumps(e))
        return e
    except Exception:
        return RuntimeError(f"{type(e).__name__}: {e}")


def _daemon(target: Callable[[Connection], None], conn: Connection, name: str) -> None:
    threading.Thread(target=target, args=(conn,), name=name, daemon=True).start()


__all__ = ["BuilderProcess", "RemoteBlocks", "RemoteSync"]
