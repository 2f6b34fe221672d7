"""Several builder processes as one (``train.batch_builders``): a pool of
``batch_process.BuilderProcess`` members that each build every n-th batch, the choice of one
process or a pool, and ``auto``'s rule for adding members while the loop waits on data."""

from __future__ import annotations

import collections
import logging
import os
import threading
import traceback
from multiprocessing.connection import Connection
from typing import Any

import torch

from vlp.platform.training.batch_process import (END, ERROR, OWN, BuilderProcess, _daemon,
                                                 _picklable)
from vlp.platform.training.ipc_tables import send_table
from vlp.platform.training.shared_reads import PeerSockets, shares_reads

log = logging.getLogger(__name__)


class BuilderPool:
    """``count`` builder processes, ``BuilderProcess``'s interface: member k builds batches
    k, k + count, … and passes over the others, and ``receive`` takes the members' batches in
    turn, so the batches are those of one builder, in order, built ``count`` at a time.

    Every member takes the whole stream (its windows are cut from every block: a batch's
    examples depend on all the windows before it), read once in all: a stream that stays in
    this process (a Ray Data shard) is read here and each block sent to every member
    (``_tee_blocks``); one that reads anywhere (the local reader) is read by the members, each
    its share of every epoch's files, sent to the others (``shared_reads``). An epoch sync
    runs once per batch, for whichever member asks first, and its answer goes to every member
    (they ask the same questions in the same order)."""

    def __init__(self, sampler: Any, source: Any, count: int, *, active: int | None = None):
        """``active``: the members that build at first (the others pass over every batch
        until ``grow``); all of them by default."""
        if count < 2:
            raise ValueError(f"a pool of builder processes: expected at least 2, got {count}")
        split = getattr(source, "split_io", None)
        blocks, sync = None, None
        if callable(split):
            source, blocks, sync = split()
        self.count = count
        self._blocks, self._sync = blocks, sync
        self._peers = (PeerSockets(count) if blocks is None
                       and shares_reads(getattr(source, "block_source", None)) else None)
        self.members = [BuilderProcess(sampler, source, part=(k, count),
                                       pooled=(blocks is not None, sync is not None),
                                       peers=self._peers.ends(k) if self._peers else None)
                        for k in range(count)]
        self.active = count if active is None else max(1, min(active, count))
        self._owners: collections.deque[int] = collections.deque()   # of batches not received
        self._due = threading.Condition()   # guards _owners (given here, taken by receive)
        self._assigned = 0        # batches given an owner
        self._rotation = 0
        self._stopping = threading.Event()
        self._answers: dict[int, list] = {}   # epoch-sync question → [answer, members told]
        self._answers_lock = threading.Lock()

    check_sendable = staticmethod(BuilderProcess.check_sendable)

    def start(self) -> None:
        for m in self.members:
            m.start()
        if self._peers is not None:
            self._peers.close()   # the members hold their ends
        if self._blocks is not None:
            threading.Thread(target=self._tee_blocks, args=([m.blocks_conn for m in
                                                             self.members],),
                             name="vlp-builders-blocks", daemon=True).start()
        if self._sync is not None:
            for m in self.members:
                _daemon(self._serve_sync, m.sync_conn, "vlp-builders-sync")

    def set_target(self, produced_in_all: int) -> None:
        """Give the new batches owners (in turn among the active members), then the target:
        a member knows its batches below a target before it sees the target."""
        if produced_in_all <= self._assigned:
            return
        given: dict[int, list[int]] = collections.defaultdict(list)
        with self._due:
            for i in range(self._assigned, produced_in_all):
                k = self._rotation % self.active
                self._rotation += 1
                given[k].append(i)
                self._owners.append(k)
            self._assigned = produced_in_all
            self._due.notify_all()
        for k, batches in given.items():
            self.members[k]._send((OWN, batches))
        for m in self.members:
            m.set_target(produced_in_all)

    def grow(self) -> bool:
        """One more member builds from the next batches given owners on; False at the
        count."""
        if self.active >= self.count:
            return False
        self.active += 1
        self._rotation = 0
        return True

    def receive(self) -> tuple[Any, torch.Tensor, tuple[int, int], dict, dict] | None:
        with self._due:   # the next batch's owner: given by set_target
            while not self._owners and not self._stopping.is_set():
                self._due.wait(0.5)
            if not self._owners:
                return None
            k = self._owners[0]
        got = self.members[k].receive()
        if got is None:
            return None
        with self._due:
            self._owners.popleft()
        task, buffer, slot, layout, after = got
        return task, buffer, (k, slot), layout, after

    def release(self, slot: tuple[int, int]) -> None:
        self.members[slot[0]].release(slot[1])

    def close(self, timeout: float = 120.0) -> None:
        self._stopping.set()
        for m in self.members:
            m.close(timeout)

    def _tee_blocks(self, conns: list[Connection]) -> None:
        """Each epoch's blocks, read once, to every member (each asks for every epoch, in
        order; one that is ahead waits for the others' requests: they need the same blocks).
        On leaving, the members' ends close: one still waiting for blocks stops waiting."""
        try:
            self._tee_epochs(conns)
        finally:
            for conn in conns:
                conn.close()

    def _tee_epochs(self, conns: list[Connection]) -> None:
        while not self._stopping.is_set():
            try:
                epochs = {conn.recv()[1] for conn in conns}
            except (EOFError, OSError):
                return
            try:
                if len(epochs) != 1:
                    raise RuntimeError(f"builder processes asked for different epochs "
                                       f"{sorted(epochs)}: their streams diverged")
                for table in self._blocks(epochs.pop()):
                    if self._stopping.is_set():
                        return
                    send_table(conns, table)   # written once, mapped by every member
                for conn in conns:
                    conn.send((END,))
            except (BrokenPipeError, EOFError, OSError):
                return
            except BaseException as e:
                for conn in conns:
                    try:
                        conn.send((ERROR, _picklable(e), traceback.format_exc()))
                    except OSError:
                        pass

    def _serve_sync(self, conn: Connection) -> None:
        asked = 0
        while True:
            try:
                exhausted = conn.recv()
            except (EOFError, OSError):
                return
            with self._answers_lock:   # the collective once per question, in order
                entry = self._answers.get(asked)
                if entry is None:
                    entry = self._answers[asked] = [bool(self._sync(exhausted)), 0]
                entry[1] += 1
                if entry[1] == self.count:
                    del self._answers[asked]
            asked += 1
            try:
                conn.send(entry[0])
            except OSError:
                return


def builder(sampler: Any, source: Any, count: int | str) -> BuilderProcess | BuilderPool:
    """One builder process, a pool of ``count``, or for ``"auto"`` a pool of one per spare
    core of which one builds at first (``AutoGrow`` adds the others)."""
    if count == "auto":
        spare = auto_builders()
        if spare == 1:
            return BuilderProcess(sampler, source)
        return BuilderPool(sampler, source, spare, active=1)
    return BuilderProcess(sampler, source) if count == 1 else BuilderPool(sampler, source, count)


def auto_builders() -> int:
    """The most builder processes ``batch_builders: auto`` may use: the cores this process
    may run on, less one for the training process's own dispatching, at most 16."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:   # not Linux
        cores = os.cpu_count() or 2
    return max(1, min(16, cores - 1))


class AutoGrow:
    """``batch_builders: auto``'s rule: after every ``window`` batches received, if the
    consumer waited for more than ``wait_share`` of that time, one more builder builds (up to
    the pool's count). Waiting means the device, through the loop, consumes faster than the
    active builders build; each added builder adds about one builder's rate."""

    def __init__(self, pool: Any, window: int = 16, wait_share: float = 0.05):
        self.pool, self.window, self.wait_share = pool, window, wait_share
        self.waited = self.elapsed = 0.0
        self.count = 0
        self.grown = 0

    def record(self, waited_s: float, elapsed_s: float) -> None:
        """A batch received after ``waited_s`` blocked in ``receive``, ``elapsed_s`` since
        the previous one."""
        if not isinstance(self.pool, BuilderPool):
            return
        self.waited += waited_s
        self.elapsed += elapsed_s
        self.count += 1
        if self.count >= self.window:
            if self.elapsed > 0 and self.waited / self.elapsed > self.wait_share:
                if self.pool.grow():
                    self.grown += 1
                    log.info("batch builders: %d active (the loop waited %.0f%% of the last "
                             "%d batches)", self.pool.active,
                             100 * self.waited / self.elapsed, self.count)
            self.waited = self.elapsed = 0.0
            self.count = 0
