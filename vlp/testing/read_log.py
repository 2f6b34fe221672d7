"""``LoggedReads``: a stream that reads anywhere (``LocalBlocks``) which appends a line to a
file for every file it reads, from whichever process reads it: the tests of a builder pool
count the reads its members share out (``training.shared_reads``)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterator

import pyarrow as pa


class LoggedReads:
    """``blocks`` as it is, and a line ``<pid> <epoch> <file>`` in ``log`` per part read;
    reading the file named ``fail`` raises (a shard gone bad)."""

    reads_anywhere = True

    def __init__(self, blocks: Any, log: Path, fail: str | None = None):
        self.blocks, self.log, self.fail = blocks, Path(log), fail

    def __call__(self, epoch: int) -> Iterator[pa.Table]:
        for part in self.parts(epoch):
            yield from self.read_part(part)

    def parts(self, epoch: int) -> list[tuple[int, Any]]:
        return [(epoch, part) for part in self.blocks.parts(epoch)]

    def part_name(self, part: tuple[int, Any]) -> str:
        return self.blocks.part_name(part[1])

    def read_part(self, part: tuple[int, Any]) -> Iterator[pa.Table]:
        epoch, inner = part
        with open(self.log, "a") as f:   # one short append: whole lines from every process
            f.write(f"{os.getpid()} {epoch} {Path(inner[0]).name}\n")
        if Path(inner[0]).name == self.fail:
            raise ValueError(f"shard {inner[0]}: column 'features' missing")
        yield from self.blocks.read_part(inner)


def read_lines(log: Path) -> list[tuple[int, int, str]]:
    """(pid, epoch, file name) per read, in the order written."""
    if not Path(log).exists():
        return []
    return [(int(p), int(e), f) for p, e, f in
            (line.split() for line in Path(log).read_text().splitlines())]


__all__ = ["LoggedReads", "read_lines"]
