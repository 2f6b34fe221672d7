"""Arrow tables between processes through shared memory: the blocks a builder process takes
from the training process (a Ray Data shard stays there) or from the other members of its
pool (``shared_reads``).

A table is written once, in Arrow's IPC stream format, into an anonymous shared-memory file
(``memfd``), whose descriptor goes over a Unix socket (``multiprocessing``'s duplex ``Pipe``) to
each process that takes it; each maps it and reads the table in place. Nothing is named, so
nothing is left behind: the memory goes when the last process drops the table. Sending the
bytes down the socket instead cost every receiver two more copies and a fresh allocation per
block, as much CPU as reading the block again (docs/benchmarks.md, "a builder pool that reads
each file once")."""

from __future__ import annotations

import mmap
import os
import tempfile
from multiprocessing.connection import Connection
from multiprocessing.reduction import recv_handle, send_handle
from typing import Any, Iterable

import pyarrow as pa

TABLE = "table"

# the pages mapped at once rather than one fault at a time when the table is first read
_POPULATE = getattr(mmap, "MAP_POPULATE", 0)


def shared_table(table: pa.Table) -> tuple[int, int]:
    """``table`` in a new anonymous shared-memory file: its descriptor (the caller closes it)
    and size. Written with ``write`` calls (Arrow's, without the GIL): the kernel fills the
    file's pages as it allocates them, twice as fast here as writing through a mapping, where
    every fresh page faults and is zeroed first."""
    fd = _anonymous_file()
    try:
        with pa.OSFile(_FD_PATH.format(fd=fd), "wb") as sink:
            with pa.ipc.new_stream(sink, table.schema) as writer:
                writer.write_table(table)
            size = sink.tell()
    except BaseException:
        os.close(fd)
        raise
    return fd, size


def _anonymous_file() -> int:
    """A shared-memory file with no name: ``memfd`` (Linux), else a file in ``/dev/shm`` (or
    the temporary folder) unlinked as soon as it is open."""
    if hasattr(os, "memfd_create"):
        return os.memfd_create("vlp-block", os.MFD_CLOEXEC)
    fd, path = tempfile.mkstemp(prefix="vlp-block-",
                                dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    os.unlink(path)
    return fd


# a path that opens a descriptor's file (Arrow's writer takes paths, not descriptors)
_FD_PATH = "/proc/self/fd/{fd}" if os.path.isdir("/proc/self/fd") else "/dev/fd/{fd}"


def map_table(fd: int, size: int) -> pa.Table:
    """The table in shared-memory file ``fd`` (closed here), read in place: the table keeps
    the mapping alive."""
    try:
        mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED | _POPULATE, prot=mmap.PROT_READ)
    finally:
        os.close(fd)
    return pa.ipc.open_stream(pa.py_buffer(mm)).read_all()


def send_table(conns: Iterable[Connection], table: pa.Table) -> None:
    """``table``, written once, to every process at the other end of ``conns``: a message
    ``(TABLE, size)`` then the descriptor (``receive_table`` takes both)."""
    fd, size = shared_table(table)
    try:
        for conn in conns:
            conn.send((TABLE, size))
            send_handle(conn, fd, 0)   # the destination pid matters on Windows only
    finally:
        os.close(fd)   # the receivers hold their own copies


def receive_table(conn: Connection, message: Any) -> pa.Table:
    """The table whose ``(TABLE, size)`` message was just received on ``conn``."""
    return map_table(recv_handle(conn), message[1])


__all__ = ["TABLE", "map_table", "receive_table", "send_table", "shared_table"]
