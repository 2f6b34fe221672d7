"""Zero-copy numpy views of Arrow list and binary columns (offsets + flat values).

The pipeline handles blocks of rows as flat arrays plus offsets, the way Arrow stores them,
so no per-row Python objects are built for features, boxes or token ids.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa


def _single(col: pa.ChunkedArray | pa.Array) -> pa.Array:
    if isinstance(col, pa.ChunkedArray):
        return col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
    return col


def binary_parts(col: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(offsets int64 [n+1] starting at 0, data uint8) of a binary column (nulls = empty)."""
    arr = _single(col)
    if pa.types.is_large_binary(arr.type):
        off_type = np.int64
    else:
        off_type = np.int32
    n = len(arr)
    bufs = arr.buffers()
    if n == 0 or bufs[2] is None:
        return np.zeros(n + 1, np.int64), np.zeros(0, np.uint8)
    offsets = np.frombuffer(bufs[1], dtype=off_type)[arr.offset:arr.offset + n + 1]
    data = np.frombuffer(bufs[2], dtype=np.uint8)[offsets[0]:offsets[-1]]
    return (offsets - offsets[0]).astype(np.int64), data


def list_parts(col: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, pa.Array]:
    """(offsets int64 [n+1] starting at 0, the flat child array) of a list column."""
    arr = _single(col)
    offsets = np.asarray(arr.offsets.to_numpy(zero_copy_only=False), dtype=np.int64)
    values = arr.values.slice(offsets[0], offsets[-1] - offsets[0])
    return offsets - offsets[0], values


def flat_numpy(values: pa.Array, dtype) -> np.ndarray:
    return np.asarray(values.to_numpy(zero_copy_only=False), dtype=dtype)


def binary_array(offsets: np.ndarray, data: np.ndarray) -> pa.Array:
    """A binary column from offsets (int, starting at 0) and the concatenated bytes."""
    return pa.Array.from_buffers(pa.binary(), len(offsets) - 1,
                                 [None, pa.py_buffer(np.ascontiguousarray(offsets, np.int32)),
                                  pa.py_buffer(np.ascontiguousarray(data).view(np.uint8))])


def list_array(offsets: np.ndarray, values: pa.Array | np.ndarray) -> pa.Array:
    return pa.ListArray.from_arrays(pa.array(np.asarray(offsets, np.int32)),
                                    values if isinstance(values, pa.Array) else pa.array(values))


def ranges(lengths: np.ndarray) -> np.ndarray:
    """concatenate(arange(n) for n in lengths), vectorised."""
    lengths = np.asarray(lengths, dtype=np.int64)
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, np.int64)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    return np.arange(total) - np.repeat(starts, lengths)
