"""How many actors Ray Data starts to read a Parquet read's footers: sized to the files.

Ray Data's Parquet reader (Ray 2.60, datasource v2) lists a read's files through a pool of
``FooterReader`` actors, 32 by default, created at each listing (the schema sample when the
dataset is built, then the ``ListFiles`` step when it runs) and killed after it. Each actor
is a Python process of its own that needs a free CPU to be scheduled: on a 2-core machine
beside two Train workers they start a few at a time, each importing Ray and pyarrow (seconds
of CPU), to read footers that one actor, with its 128 I/O threads, reads in milliseconds.
A tiny-world fit started ~7 of them (`make test`: 22 in the 3 fits of
``tests/test_pretrain_train.py``).

The pool's size is read from ``RAY_DATA_PARQUET_FOOTER_NUM_ACTORS`` when the reader's file
indexer is built (``read_parquet``, in this process) and travels with it, so it is set here
for that call only: one actor per ``FILES_PER_READER`` files, Ray's default at most. A value
the user set stands.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from contextlib import contextmanager

ENV = "RAY_DATA_PARQUET_FOOTER_NUM_ACTORS"
RAY_DEFAULT = 32
FILES_PER_READER = 256     # footers per actor: a few KB each, read 128 at a time


def footer_readers(files: int) -> int:
    """Actors for a read of ``files`` Parquet files."""
    return max(1, min(RAY_DEFAULT, math.ceil(files / FILES_PER_READER)))


@contextmanager
def sized_footer_pool(files: int) -> Iterator[None]:
    """Around ``ray.data.read_parquet`` of ``files`` files: its footer pool sized to them
    (unless ``RAY_DATA_PARQUET_FOOTER_NUM_ACTORS`` is set already)."""
    if ENV in os.environ:
        yield
        return
    os.environ[ENV] = str(footer_readers(files))
    try:
        yield
    finally:
        os.environ.pop(ENV, None)
