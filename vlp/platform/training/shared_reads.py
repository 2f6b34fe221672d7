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

It cannot deadlock: a member sends a part to every peer before it reads its next one, and
every member takes the parts in order, so the earliest part any member waits for has been read
(or is being sent) by its reader, and the peer it is being sent to first is taking it (a
member with its queue full has taken every part the others still need: they all cut the same
windows from the same blocks).
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
    that sends each block to the peers), the others' taken from their pipes, in the epoch's
    order."""

    def __init__(self, blocks: Any, member: int, count: int, sends: dict[int, Connection],
                 receives: dict[int, Connection], ahead: int = 2):
        self.blocks, self.member, self.count = blocks, member, count
        self.sends, self.receives = sends, receives
        self.ahead = ahead          # this member's blocks read before it takes them

    def __call__(self, epoch: int) -> Iterator[pa.Table]:
        parts = self.blocks.parts(epoch)
        own: queue.Queue = queue.Queue(maxsize=self.ahead)
        threading.Thread(target=self._read_own, args=(parts, own), daemon=True,
                         name=f"vlp-shared-reads-{self.member}").start()
        for i in range(len(parts)):
            owner = i % self.count
            while True:
                kind, payload = own.get() if owner == self.member else self._receive(owner)
                if kind == PART_END:
                    break
                if kind == FAILED:
                    name = getattr(self.blocks, "part_name", repr)(parts[i])
                    raise RuntimeError(f"reading {name} (part {i} of epoch {epoch}) failed in "
                                       f"builder process {owner}:\n{payload}")
                yield payload

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

    def _read_own(self, parts: list, own: queue.Queue) -> None:
        """Parts member, member + count, …: each block to every peer, then here. A failed
        read goes to the peers and here as the part's end; a peer gone (the pool closing, or
        that member failed) ends the reading here with that said."""
        for part in parts[self.member::self.count]:
            try:
                for table in self.blocks.read_part(part):
                    fd, size = shared_table(table)
                    try:
                        self._to_peers((TABLE, size), fd)
                    finally:
                        os.close(fd)   # the peers hold it now
                    own.put((TABLE, table))
                end = (PART_END, None)
            except _PeerGone as gone:
                own.put((FAILED, str(gone)))
                return
            except BaseException:
                end = (FAILED, traceback.format_exc())
            try:
                self._to_peers(end)
            except _PeerGone as gone:
                own.put((FAILED, str(gone)))
                return
            own.put(end)
            if end[0] == FAILED:
                return

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


__all__ = ["PeerSockets", "SharedReads", "shares_reads"]
