"""The worker context of a kept worker group (``worker_group.py``): who a rank is, its
device, and where a run's checkpoints go — the run's own folder in its storage (a path or a
URI), in the layout Ray Train writes (``<storage>/<run>/checkpoint_…``), so a run resumes
from it, ``launch.resume_problem`` reads it, and a later Ray Train run of the same name finds
it, whichever of the two started it.

Every rank copies its checkpoint files into the same folder (as Ray Train merges the ranks'
uploads); rank 0 copies the trainer meta (``vlp_trainer.json``, what marks a checkpoint
complete) last, then removes checkpoints beyond ``keep``, and prints the report's progress
line (what ``progress.ProgressPrinter`` prints for a Ray Train run).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Any, Iterator

import torch

from vlp.platform.cluster.run_storage import open_location
from vlp.platform.training.checkpointing import META_FILE


class GroupContext:
    """``worker_context.WorkerContext`` of rank ``rank`` of a kept group, for one run."""

    def __init__(self, rank: int, world_size: int, local_rank: int, storage: str, run: str,
                 keep: int, progress: dict[str, Any], device_index: int = 0):
        self.rank, self.world_size, self.local_rank = rank, world_size, local_rank
        self.device_index = device_index   # its GPU among those of its node's ranks
        self.storage, self.run, self.keep = storage, run, keep
        self.progress = progress      # progress_line's total_steps, stage_names, run, job

    def device(self, use_gpu: bool) -> torch.device:
        if not use_gpu:
            return torch.device("cpu")
        # the actor's one GPU, among its node's ranks' (worker_group: share_node_gpus)
        if not torch.cuda.is_available():
            raise RuntimeError("scaling.use_gpu is set but this worker sees no CUDA device")
        torch.cuda.set_device(self.device_index)
        return torch.device("cuda", self.device_index)

    @contextlib.contextmanager
    def checkpoint_folder(self) -> Iterator[str | None]:
        folder = open_location(self.storage)
        meta = folder.latest_checkpoint_meta(self.run)
        if meta is None:
            yield None
            return
        name = meta["uri"].rstrip("/").rsplit("/", 1)[-1]
        if folder.is_local:
            yield folder.fs_path(self.run, name)
            return
        import pyarrow.fs as pafs

        with tempfile.TemporaryDirectory(prefix="vlp-group-ckpt-") as tmp:
            pafs.copy_files(folder.fs_path(self.run, name), tmp, source_filesystem=folder.fs,
                            destination_filesystem=pafs.LocalFileSystem())
            yield tmp

    def report(self, metrics: dict[str, Any], checkpoint_dir: str | None,
               dir_name: str | None) -> None:
        if checkpoint_dir is not None:
            self._persist(checkpoint_dir, dir_name or "checkpoint")
        if self.rank == 0 and metrics:
            from vlp.platform.training.progress import progress_line

            print(progress_line(metrics, checkpoint=checkpoint_dir is not None,
                                **self.progress), flush=True)

    def _persist(self, local: str, name: str) -> None:
        folder = open_location(self.storage)
        files = sorted(p for p in Path(local).rglob("*") if p.is_file())
        meta = [p for p in files if p.name == META_FILE]
        for p in [p for p in files if p.name != META_FILE] + meta:   # the meta last
            folder.upload(p, self.run, name, *p.relative_to(local).parts)
        if self.rank == 0 and self.keep > 0:
            done = [n for n in folder.subfolders(self.run)
                    if n.startswith("checkpoint_") and folder.exists(self.run, n, META_FILE)]
            for old in sorted(done, key=lambda n: _step(folder, self.run, n))[:-self.keep]:
                folder.fs.delete_dir(folder.fs_path(self.run, old))


def _step(folder: Any, run: str, name: str) -> int:
    import json

    return int(json.loads(folder.read_text(run, name, META_FILE))["step"])


def node_address() -> str:
    """This node's address as Ray knows it (what the other ranks connect to)."""
    import ray

    return ray.util.get_node_ip_address() if ray.is_initialized() else os.uname().nodename
