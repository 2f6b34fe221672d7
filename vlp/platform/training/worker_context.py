"""Where a training worker learns who it is and where its checkpoints go: Ray Train's
context on a cluster (``RayTrainContext``), or the local runner's stand-in
(``local_runner.LocalContext``: rank 0 of 1, checkpoints to a folder) for one process
without Ray. The loop (``loop._Worker``) reads only this interface."""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, Protocol

import torch

from vlp.platform.training.gpu_placement import ray_worker_placement, set_allocator


class WorkerContext(Protocol):
    rank: int
    world_size: int
    local_rank: int

    def device(self, use_gpu: bool) -> torch.device:
        """This worker's device."""

    def checkpoint_folder(self) -> contextlib.AbstractContextManager[str | None]:
        """The folder of the checkpoint to resume from, inside the ``with`` (None: a fresh
        run)."""

    def report(self, metrics: dict[str, Any], checkpoint_dir: str | None,
               dir_name: str | None) -> None:
        """Metrics of the steps since the last report, with a checkpoint folder to persist
        under ``dir_name`` (the folder goes away after the call)."""


class RayTrainContext:
    """``ray.train``'s worker context (imported when built: the local path never needs Ray)."""

    def __init__(self) -> None:
        import ray.train

        set_allocator()         # before this worker's first CUDA allocation
        ctx = ray.train.get_context()
        self.rank, self.world_size = ctx.get_world_rank(), ctx.get_world_size()
        self.local_rank = ctx.get_local_rank()

    def device(self, use_gpu: bool) -> torch.device:
        """Ray Train's device for this worker, checked against LOCAL_RANK and the GPU Ray
        gave it (``gpu_placement``): the one device vlp and DeepSpeed both use."""
        import ray.train.torch

        if not use_gpu:
            return torch.device("cpu")
        device = ray.train.torch.get_device()
        problem = ray_worker_placement(device).problem()
        if problem:
            raise RuntimeError(f"GPU placement: {problem}")
        return device

    @contextlib.contextmanager
    def checkpoint_folder(self) -> Iterator[str | None]:
        import ray.train

        ckpt = ray.train.get_checkpoint()
        if ckpt is None:
            yield None
            return
        with ckpt.as_directory() as folder:
            yield folder

    def report(self, metrics: dict[str, Any], checkpoint_dir: str | None,
               dir_name: str | None) -> None:
        from vlp.platform.training.reporter import ray_report

        ray_report(metrics, checkpoint_dir, dir_name)
