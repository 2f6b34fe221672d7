"""Errors of downstream data that name what is wrong (the table, the ids, how many)."""

from __future__ import annotations


class DownstreamDataError(ValueError):
    """A task table or its images cannot serve the benchmark; the message says why."""


class MissingImagesError(DownstreamDataError):
    """A task table refers to image ids that no image shard of the split holds."""

    def __init__(self, table: str, missing: list[str], total: int, shards: list[str]):
        self.table, self.missing, self.total = table, missing, total
        shown = ", ".join(repr(m) for m in missing[:5]) + (", ..." if len(missing) > 5 else "")
        where = ", ".join(shards[:3]) + (f" (+{len(shards) - 3} more)" if len(shards) > 3 else "")
        super().__init__(f"{table}: {len(missing)} of {total} image ids are missing from the "
                         f"feature shards [{where}]: {shown}")
