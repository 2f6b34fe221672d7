"""The reading of a stream shared out among a pool's builder processes.

Every member of a ``BuilderPool`` needs every block of the stream (a batch's examples depend on
all the windows before it), and a stream that reads anywhere (the local reader) was read by
each member whole: Parquet decoding and the row transform are 60–70% of one builder's CPU,
done n times over. Here the epoch's reads (``parts(epoch)``: one file each) are dealt out:
member k reads parts k, k + n, …, and shares each block with the other members; it takes the
other parts from their readers. Every member still sees every block, in the same order, so the
batches are the batches of one builder; each part is read once in the pool.

A block travels as one copy into shared memory, over a Unix socket from each member to each
other one (``ipc_tables``).

A member's reader runs ahead of its own consumption by bytes, not by a few blocks: the members
take the parts in turn, so a reader held two blocks ahead read its next part only while that
part was being taken, one reader at a time, and the pool read at one reader's speed however
many builders (measured on 2 cores: two builders kept 1.74 of them busy, 1.93 now;
docs/benchmarks.md). Ahead by a part or more, every member's reader works at once.

It cannot deadlock: a member sends a part to every peer before it reads its next one, and
every member takes the parts in order, so the earliest part any member waits for has been read
(or is being sent) by its reader, and the peer it is being sent to first is taking it (a
member whose reader waits for room holds only parts later than the ones it is taking, and it
takes those: they all cut the same windows from the same blocks).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import threading
import traceback
from multiprocessing.connection import Connection
from multiprocessing.reduction import send_handle
from typing import Any, Iterator

import pyarrow as pa

from vlp.platform.training.ipc_tables import TABLE, receive_table, shared_table

PART_END, FAILED = "part_end", "failed"
# A member's own blocks read and not yet taken, at most (and always one block): a part (a
# file) or more of real shards, so that every reader works while the others' parts are taken.
READ_AHEAD_BYTES = 256 << 20


def shares_reads(blocks: Any) -> bool:
    """Whether a pool's members can share out the reading of ``blocks``: it reads anywhere
    and lists an epoch's reads (``parts``, ``read_part``)."""
    return (getattr(blocks, "reads_anywhere", False) and callable(getattr(blocks, "parts", None))
            and callable(getattr(blocks, "read_part", None)))


class PeerSockets:
    """One Unix socket pair for each ordered pair of a pool's ``count`` members, made before
    they start (file descriptors travel over sockets, not pipes); ``ends(k)`` are member k's
    (sends to each peer, receives from each), ``close`` drops the pool's copies once the
    members hold theirs (a member that exits then breaks its sockets)."""

    def __init__(self, count: int):
        ctx = mp.get_context("spawn")
        self.count = count
        self._pipes: dict[tuple[int, int], tuple[Connection, Connection]] = {}
        for src in range(count):
            for dst in range(count):
                if src != dst:
                    receive, send = ctx.Pipe(duplex=True)
                    self._pipes[src, dst] = (receive, send)

    def ends(self, member: int) -> tuple[dict[int, Connection], dict[int, Connection]]:
        sends = {dst: self._pipes[member, dst][1] for dst in range(self.count) if dst != member}
        receives = {src: self._pipes[src, member][0] for src in range(self.count)
                    if src != member}
        return sends, receives

    def close(self) -> None:
        for receive, send in self._pipes.values():
            receive.close()
            send.close()


class SharedReads:
    """``blocks(epoch)`` in member ``member`` of ``count``: its own parts read here (a thread
    that sends each block to the peers), the others' taken from their sockets, in the epoch's
    order. The blocks are asked for epoch after epoch (``BlockReader``); the reading thread
    goes on into the next epoch's parts as soon as this one's are read, so the part that opens
    an epoch is not read only once it is needed (at most one epoch ahead of the asking)."""

    def __init__(self, blocks: Any, member: int, count: int, sends: dict[int, Connection],
                 receives: dict[int, Connection], ahead_bytes: int = READ_AHEAD_BYTES):
        self.blocks, self.member, self.count = blocks, member, count
        self.sends, self.receives = sends, receives
        self._held = _HeldBytes(ahead_bytes)   # this member's blocks read, not yet taken
        self._own: queue.Queue = queue.Queue()
        self._asked = threading.Condition()   # guards _next_epoch
        self._next_epoch: int | None = None   # the epoch the next call asks for

    def __call__(self, epoch: int) -> Iterator[pa.Table]:
        with self._asked:
            if self._next_epoch is None:
                threading.Thread(target=self._read_epochs, args=(epoch,), daemon=True,
                                 name=f"vlp-shared-reads-{self.member}").start()
            elif epoch != self._next_epoch:
                raise RuntimeError(f"builder process {self.member}: the blocks of epoch "
                                   f"{epoch} were asked for after epoch {self._next_epoch - 1}; "
                                   f"a pool's shared reads go epoch after epoch")
            self._next_epoch = epoch + 1
            self._asked.notify_all()
        parts = self.blocks.parts(epoch)
        for i in range(len(parts)):
            owner = i % self.count
            while True:
                if owner == self.member:
                    kind, payload = self._own.get()
                    if kind == TABLE:
                        self._held.taken(payload.nbytes)
                else:
                    kind, payload = self._receive(owner)
                if kind == PART_END:
                    break
                if kind == FAILED:
                    name = getattr(self.blocks, "part_name", repr)(parts[i])
                    raise RuntimeError(f"reading {name} (part {i} of epoch {epoch}) failed in "
                                       f"builder process {owner}:\n{payload}")
                yield payload

    def _read_epochs(self, epoch: int) -> None:
        """This member's parts of ``epoch``, then of each next one once it is asked for
        or the one before it is (one epoch ahead at most: an epoch with no parts here does
        not spin)."""
        while True:
            if not self._read_own(self.blocks.parts(epoch)):
                return
            epoch += 1
            with self._asked:
                while self._next_epoch < epoch:
                    self._asked.wait()

    def _receive(self, owner: int) -> tuple[str, Any]:
        conn = self.receives[owner]
        try:
            message = conn.recv()
            if message[0] == TABLE:
                return TABLE, receive_table(conn, message)
            return message
        except (EOFError, OSError):
            raise RuntimeError(f"builder process {owner} stopped while the others were "
                               f"taking the blocks it reads") from None

    def _read_own(self, parts: list) -> bool:
        """Parts member, member + count, …: each block to every peer, then here; False where
        the reading stops. A failed read goes to the peers and here as the part's end; a peer
        gone (the pool closing, or that member failed) ends the reading here with that said."""
        own, held = self._own, self._held
        for part in parts[self.member::self.count]:
            try:
                for table in self.blocks.read_part(part):
                    fd, size = shared_table(table)
                    try:
                        self._to_peers((TABLE, size), fd)
                    finally:
                        os.close(fd)   # the peers hold it now
                    held.add(table.nbytes)
                    own.put((TABLE, table))
                    held.wait_room()   # before the next block is read
                end = (PART_END, None)
            except _PeerGone as gone:
                own.put((FAILED, str(gone)))
                return False
            except BaseException:
                end = (FAILED, traceback.format_exc())
            try:
                self._to_peers(end)
            except _PeerGone as gone:
                own.put((FAILED, str(gone)))
                return False
            own.put(end)
            if end[0] == FAILED:
                return False
        return True

    def _to_peers(self, msg: tuple, fd: int | None = None) -> None:
        for peer, conn in self.sends.items():
            try:
                conn.send(msg)
                if fd is not None:
                    send_handle(conn, fd, peer)
            except OSError as e:
                raise _PeerGone(f"builder process {peer} stopped while builder process "
                                f"{self.member} was sending it blocks ({e})") from None


class _PeerGone(Exception):
    pass


class _HeldBytes:
    """The bytes of a member's own blocks read and not yet taken: its reader waits for room
    once they reach ``limit`` (a single block over it still passes: it waits after)."""

    def __init__(self, limit: int):
        self.limit = limit
        self.held = 0
        self._room = threading.Condition()

    def add(self, nbytes: int) -> None:
        with self._room:
            self.held += nbytes

    def taken(self, nbytes: int) -> None:
        with self._room:
            self.held -= nbytes
            self._room.notify_all()

    def wait_room(self) -> None:
        with self._room:
            while self.held >= self.limit:
                self._room.wait()


__all__ = ["PeerSockets", "SharedReads", "shares_reads"]
