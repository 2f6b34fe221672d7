"""A stand-in for ``ray.tune``'s report / get_checkpoint, for sweep trials run outside Tune
(tests/test_sweep_replicates.py, tests/test_sweep_worker_group.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

import ray.tune


class FakeTune:
    """ray.tune.report / get_checkpoint: keeps every report and its checkpoint's files."""

    def __init__(self, root: Path):
        self.root = root
        self.reports: list[dict] = []
        self.checkpoint: ray.tune.Checkpoint | None = None

    def report(self, metrics, checkpoint=None):
        self.reports.append(dict(metrics))
        kept = self.root / f"ckpt{len(self.reports)}"
        with checkpoint.as_directory() as folder:
            shutil.copytree(folder, kept)
        self.checkpoint = ray.tune.Checkpoint.from_directory(str(kept))

    def get_checkpoint(self):
        return self.checkpoint
