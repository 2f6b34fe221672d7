"""Arrow tables as bytes between processes (Arrow's IPC stream format): the blocks a builder
process receives from the training process or from the other members of its pool."""

from __future__ import annotations

import pyarrow as pa


def to_ipc(table: pa.Table) -> pa.Buffer:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue()


def from_ipc(data: bytes) -> pa.Table:
    """The table, over ``data`` without a copy."""
    return pa.ipc.open_stream(pa.py_buffer(data)).read_all()


__all__ = ["from_ipc", "to_ipc"]
