"""The worker side of a job in one process, without Ray: the loop (``loop._Worker``: model,
tasks, batcher, DeepSpeed engine, prefetcher, the loop's own step, checkpoints) with
``LocalContext`` in place of Ray Train's context — rank 0 of 1, a local batch stream (the
components' own), checkpoints reported to a folder.

    result = run_local(loop_config, components, tracking, run_dir)

Used by ``vlp pretrain --local`` (debugging on one machine) and by the GPU check
(``jobs/benchmarks/gpu_check.py``), which runs on a GPU box that has torch but no Ray. The
checkpoint layout is Ray Train's (``<run_dir>/checkpoint_step…``), so a local run resumes
from its own folder as a Ray run resumes from its storage. Nothing here imports Ray or
MLflow (MLflow only if the tracking spec enables it).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from vlp.platform.training.checkpointing import META_FILE
from vlp.platform.training.gpu_placement import set_allocator
from vlp.platform.training.loop import _Worker
from vlp.platform.training.loop_config import LoopConfig
from vlp.platform.training.rendezvous import join_group, open_store

METRICS_FILE = "metrics.jsonl"   # one line per report, beside the checkpoints


class LocalContext:
    """Ray Train's worker context for one local process: rank 0 of 1; the checkpoint to
    resume is the newest complete one in ``run_dir``; a reported checkpoint is copied there
    under its name (through a temporary name, renamed when complete), the oldest beyond
    ``keep`` removed; every report's metrics are appended to ``metrics.jsonl``."""

    rank, world_size, local_rank = 0, 1, 0

    def __init__(self, run_dir: str | Path, keep: int = 0, say: Callable[[str], None] = print):
        self.run_dir, self.keep, self.say = Path(run_dir), keep, say
        self.run_dir.mkdir(parents=True, exist_ok=True)

    def device(self, use_gpu: bool) -> torch.device:
        if not use_gpu:
            return torch.device("cpu")
        if not torch.cuda.is_available():
            raise RuntimeError("scaling.use_gpu is set but torch sees no CUDA device here "
                               "(set scaling.use_gpu=false to run on the CPU)")
        torch.cuda.set_device(0)
        return torch.device("cuda", 0)

    def checkpoints(self) -> list[Path]:
        """Complete checkpoints, oldest first (the name carries the zero-padded step)."""
        return sorted(p for p in self.run_dir.glob("checkpoint_*")
                      if p.is_dir() and (p / META_FILE).exists())

    @contextlib.contextmanager
    def checkpoint_folder(self) -> Iterator[str | None]:
        found = self.checkpoints()
        yield str(found[-1]) if found else None

    def report(self, metrics: dict[str, Any], checkpoint_dir: str | None,
               dir_name: str | None) -> None:
        with open(self.run_dir / METRICS_FILE, "a") as f:
            f.write(json.dumps(metrics, default=float) + "\n")
        self.say(progress_line(metrics))
        if checkpoint_dir is None:
            return
        final = self.run_dir / dir_name
        partial = self.run_dir / f".{dir_name}.partial"
        shutil.rmtree(partial, ignore_errors=True)
        shutil.copytree(checkpoint_dir, partial)
        if final.exists():
            shutil.rmtree(final)
        partial.rename(final)
        if self.keep > 0:
            for old in self.checkpoints()[:-self.keep]:
                shutil.rmtree(old, ignore_errors=True)


def progress_line(metrics: dict[str, Any]) -> str:
    """One line per report (what Ray's progress printer shows for a cluster run)."""
    parts = [f"step {metrics.get('step')}", f"loss {metrics.get('loss', float('nan')):.4f}",
             f"{metrics.get('examples_per_s', 0.0):,.0f} examples/s",
             f"data wait {metrics.get('data_wait_share', 0.0):.0%}"]
    if "mfu" in metrics:
        parts.append(f"MFU {metrics['mfu']:.1%} padded, {metrics['mfu_real']:.1%} real tokens")
    return "[vlp local] " + ", ".join(parts)


_group_store: Any = None    # one_process_group's store, held while its group lives


@contextlib.contextmanager
def one_process_group(use_gpu: bool) -> Iterator[None]:
    """A process group of one rank (DeepSpeed and the loop's all-reduce need one): NCCL on a
    GPU, gloo otherwise, through a local store (``rendezvous``). It stays up for the life of
    the process, and so does its store: DeepSpeed keeps its handle of the group, and a later
    run in the same process (the GPU check runs several; ``vlp pretrain --local`` twice in
    one interpreter) must find the same group, not a new one."""
    import torch.distributed as dist

    global _group_store
    if not dist.is_initialized():
        _group_store = open_store()
        port = _group_store.port
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1",
                          MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        join_group("nccl" if use_gpu else "gloo", "127.0.0.1", port, 0, 1)
    yield


def run_local(loop: LoopConfig, components: Any, tracking: dict[str, Any],
              run_dir: str | Path, after: Callable[[Any], None] | None = None
              ) -> dict[str, Any]:
    """Run (or resume from ``run_dir``) ``loop`` in this process; the loop's return value
    (history, final step, checkpoint path, ...). ``after(worker)`` runs once the loop is
    done, before the engine goes (the GPU check times a bare loop on that engine)."""
    if loop.scaling.num_workers != 1:
        raise ValueError(f"the local runner is one process: scaling.num_workers is "
                         f"{loop.scaling.num_workers} (set scaling.num_workers=1)")
    run_dir = Path(run_dir)
    set_allocator()
    with one_process_group(loop.scaling.use_gpu):
        worker = _Worker(loop, {"config": loop, "components": components, "tracking": tracking,
                                "run_dir": str(run_dir),
                                "context": LocalContext(run_dir, loop.checkpoint_keep)})
        try:
            value = worker.run()
            if after is not None:
                after(worker)
            return value
        finally:
            if worker.engine is not None:
                worker.engine.destroy()
