"""Every optimizer step's record, kept in the run's storage as Parquet: the full-resolution
history that MLflow no longer gets (it receives window means, ``metric_windows``).

    <storage>/<run>/steps/part-<first step>-<last step>.parquet
        (a part at each checkpoint, every PART_ROWS steps between them, and at the end)

    log = StepLog(storage, "pretrain-tiny")
    log.resume_at(step)          # drop what a restarted job will train again
    log.add(record); log.flush(force=at_checkpoint)
    read_steps(storage, "pretrain-tiny")     # a pandas DataFrame, one row per step

``pandas.read_parquet("<run>/steps")`` reads the folder as well (files whose names start with
a dot, as half-written ones do, are skipped by pyarrow). A resumed job rewinds to its
checkpoint's step first (``resume_at``), so the parts never hold a step twice.
"""

from __future__ import annotations

import io
import posixpath
from typing import Any

STEPS_FOLDER = "steps"
# rows per part between checkpoints: a 500k-step run writes ~500 parts, not one per report
# (a crash loses nothing by it: the steps after the checkpoint are trained again)
PART_ROWS = 1000


def part_name(first: int, last: int) -> str:
    return f"part-{first:010d}-{last:010d}.parquet"


def _span(name: str) -> tuple[int, int] | None:
    if not (name.startswith("part-") and name.endswith(".parquet")):
        return None
    first, _, last = name[len("part-"):-len(".parquet")].partition("-")
    return int(first), int(last)


class StepLog:
    def __init__(self, storage: Any, run_name: str):
        self.storage = storage              # a run_storage.RunStorage
        self.run_name = run_name
        self.rows: list[dict[str, Any]] = []
        self.written = 0
        self.error: str | None = None       # the last write's failure (rows kept, retried)

    def parts(self) -> list[tuple[int, int, str]]:
        import pyarrow.fs as pafs

        sel = pafs.FileSelector(self.storage.fs_path(self.run_name, STEPS_FOLDER),
                                allow_not_found=True)
        out = []
        for info in self.storage.fs.get_file_info(sel):
            span = _span(posixpath.basename(info.path))
            if span:
                out.append((*span, posixpath.basename(info.path)))
        return sorted(out)

    def resume_at(self, step: int) -> None:
        """Parts after ``step`` are removed and one that spans it is cut at it: the job trains
        those steps again from its checkpoint."""
        for first, last, name in self.parts():
            if last <= step:
                continue
            if first <= step:
                table = _read_table(self.storage, self.run_name, name)
                kept = table.filter(_le(table, step))
                self._write(kept, first, step)
            self.storage.delete(self.run_name, STEPS_FOLDER, name)

    def add(self, record: dict[str, Any]) -> None:
        self.rows.append(dict(record))

    def flush(self, force: bool = True) -> None:
        """The rows since the last flush, as one part; unless ``force``, only once there are
        ``PART_ROWS`` of them. A failed write keeps them for the next flush (the training
        goes on; the reason is in ``error``)."""
        if not self.rows or (not force and len(self.rows) < PART_ROWS):
            return
        import pyarrow as pa

        try:
            # every key of every row (a task's loss is only there on the steps that drew it)
            keys = list(dict.fromkeys(k for r in self.rows for k in r))
            table = pa.table({k: [r.get(k) for r in self.rows] for k in keys})
            self._write(table, int(self.rows[0]["step"]), int(self.rows[-1]["step"]))
        except Exception as e:   # storage down: keep the rows, say so at the end
            self.error = f"{type(e).__name__}: {str(e)[:300]}"
            return
        self.written += len(self.rows)
        self.rows = []
        self.error = None

    def _write(self, table: Any, first: int, last: int) -> None:
        import pyarrow.parquet as pq

        buf = io.BytesIO()
        pq.write_table(table, buf)
        self.storage.write_bytes(buf.getvalue(), self.run_name, STEPS_FOLDER,
                                 part_name(first, last))


def read_steps(storage: Any, run_name: str):
    """Every step's record of the run as a pandas DataFrame sorted by step (empty when the
    run wrote none)."""
    import pandas as pd
    import pyarrow as pa

    tables = [_read_table(storage, run_name, name)
              for _, _, name in StepLog(storage, run_name).parts()]
    if not tables:
        return pd.DataFrame()
    table = pa.concat_tables(tables, promote_options="default")
    return table.to_pandas().sort_values("step", kind="stable").reset_index(drop=True)


def _read_table(storage: Any, run_name: str, name: str):
    import pyarrow.parquet as pq

    return pq.read_table(io.BytesIO(storage.read_bytes(run_name, STEPS_FOLDER, name)))


def _le(table: Any, step: int):
    import pyarrow.compute as pc

    return pc.less_equal(table["step"], step)
