"""Which GPU a Ray Train worker computes on, from one source, and the CUDA allocator setting
of every GPU process vlp starts.

The device: vlp takes it from ``ray.train.torch.get_device()`` (the worker's GPU, as an index
into the ``CUDA_VISIBLE_DEVICES`` that Ray Train shares between the workers of a node);
DeepSpeed, left alone, takes ``LOCAL_RANK``. They agree only because Ray Train orders a node's
workers by GPU id. So vlp hands DeepSpeed its own device (``deepspeed_args``: DeepSpeed's
``device_rank``), and before any engine is built each GPU worker checks that its local rank,
its ``LOCAL_RANK``, its device index and the ``CUDA_VISIBLE_DEVICES`` entry of the GPU Ray gave
it agree (``Placement.problem``): a worker that would compute on another worker's GPU stops
with one line saying which.

The allocator: expandable segments, so that the varying batch shapes of budget batching (and
the varying image sizes of extraction) do not fragment CUDA's caching allocator. Set by each
entry (training workers, the local runner, extraction actors, Tune trials) into its
environment, and into the running allocator where CUDA has started before it (a Ray Train
worker: Ray sets the device first); and in the runtime environment of a local Ray. A setting
the user exported, under either of torch's names, wins.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, MutableMapping
from dataclasses import dataclass
from types import SimpleNamespace

import torch

# torch ≥ 2.9 reads PYTORCH_ALLOC_CONF and still the older PYTORCH_CUDA_ALLOC_CONF (the
# GPU machine's torch 2.11 both); the older name is the one every torch vlp meets reads
ALLOC_VAR = "PYTORCH_CUDA_ALLOC_CONF"
ALLOC_VARS = ("PYTORCH_ALLOC_CONF", ALLOC_VAR)
ALLOC_SETTING = "expandable_segments:True"


def allocator_env(environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """The allocator variable for a Ray runtime environment: the user's, else ours."""
    env = os.environ if environ is None else environ
    for name in ALLOC_VARS:
        if env.get(name):
            return {name: env[name]}
    return {ALLOC_VAR: ALLOC_SETTING}


def set_allocator(environ: MutableMapping[str, str] | None = None) -> None:
    """Into the environment, read by CUDA's allocator once, when CUDA starts; and where CUDA
    has started already, into the running allocator too (it applies to the segments it maps
    from then on). A Ray Train worker is such a process: Ray sets its device, which starts
    CUDA, before the train function runs; so is a driver that asked for the device's name."""
    env = os.environ if environ is None else environ
    if any(env.get(name) for name in ALLOC_VARS):
        return
    env[ALLOC_VAR] = ALLOC_SETTING
    if environ is None and torch.cuda.is_available() and torch.cuda.is_initialized():
        running_allocator_settings()(ALLOC_SETTING)


def running_allocator_settings():
    """torch's call that changes the running CUDA allocator's settings: the accelerator-wide
    one (newer torch), else the CUDA one it replaced."""
    setter = getattr(torch._C, "_accelerator_setAllocatorSettings", None)
    return setter if setter is not None else torch.cuda.memory._set_allocator_settings


@dataclass(frozen=True)
class Placement:
    rank: int
    local_rank: int                 # Ray Train's
    env_local_rank: str | None      # LOCAL_RANK, what DeepSpeed reads by default
    device_index: int | None        # vlp's device (ray.train.torch.get_device())
    visible: tuple[str, ...]        # CUDA_VISIBLE_DEVICES
    gpu_ids: tuple[str, ...]        # the GPUs Ray gave this worker

    def visible_entry(self) -> str | None:
        if self.device_index is None or self.device_index >= len(self.visible):
            return None
        return self.visible[self.device_index]

    def problem(self) -> str | None:
        """Why this worker would compute on a GPU that is not its own (one line), or None."""
        who = f"rank {self.rank} (local rank {self.local_rank})"
        if not self.gpu_ids:
            return f"{who}: Ray gave this worker no GPU although the job asks for one"
        if len(self.gpu_ids) != 1:
            return (f"{who}: Ray gave this worker GPUs {', '.join(self.gpu_ids)}; vlp runs one "
                    f"GPU per worker")
        if self.visible_entry() != self.gpu_ids[0]:
            return (f"{who}: device cuda:{self.device_index} is CUDA_VISIBLE_DEVICES entry "
                    f"{self.visible_entry()!r} of {','.join(self.visible) or '(unset)'}, not "
                    f"GPU {self.gpu_ids[0]} that Ray gave this worker")
        if self.env_local_rank != str(self.local_rank):
            return (f"{who}: LOCAL_RANK is {self.env_local_rank!r}, expected "
                    f"{self.local_rank} (DeepSpeed reads it)")
        if self.device_index != self.local_rank:
            return (f"{who}: computes on cuda:{self.device_index}, but its local rank is "
                    f"{self.local_rank}: Ray Train did not order this node's workers by GPU id")
        return None


def ray_gpu_ids() -> list[str]:
    """The GPUs Ray gave this actor or worker (none on a CPU node); touches no CUDA."""
    import ray

    return [str(g) for g in ray.get_runtime_context().get_accelerator_ids().get("GPU", [])]


def node_visible(gpu_ids: Iterable[str]) -> list[str]:
    """The GPUs of all of a node's ranks, in Ray Train's order (by id, numerically): what
    each of them is to see, so that NCCL can go peer to peer between them (a process that
    sees only its own GPU cannot)."""
    return sorted(set(gpu_ids), key=lambda i: (len(i), i))


def share_node_gpus(visible: list[str], mine: list[str]) -> int:
    """This process made to see its node's ``visible`` GPUs (before CUDA starts here); the
    index of its own one (``mine``, what Ray gave it) among them: its CUDA device. 0 where
    there is nothing to share (no GPU)."""
    if not (visible and mine):
        return 0
    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(visible)
    return visible.index(mine[0])


def ray_worker_placement(device: torch.device) -> Placement:
    """This Ray Train worker's placement (inside a worker only)."""
    import ray
    import ray.train

    ctx = ray.train.get_context()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    return Placement(rank=ctx.get_world_rank(), local_rank=ctx.get_local_rank(),
                     env_local_rank=os.environ.get("LOCAL_RANK"),
                     device_index=device.index if device.type == "cuda" else None,
                     visible=tuple(v for v in visible.split(",") if v),
                     gpu_ids=tuple(str(g) for g in ray.get_gpu_ids()))


def deepspeed_args(device: torch.device | None) -> SimpleNamespace | None:
    """``deepspeed.initialize``'s ``args``: on a GPU, vlp's device as DeepSpeed's
    ``device_rank`` (DeepSpeed then takes it instead of ``LOCAL_RANK``); elsewhere None."""
    if device is None or device.type != "cuda":
        return None
    return SimpleNamespace(device_rank=device.index if device.index is not None
                           else torch.cuda.current_device())


__all__ = ["ALLOC_SETTING", "ALLOC_VAR", "ALLOC_VARS", "Placement", "allocator_env",
           "deepspeed_args", "node_visible", "ray_gpu_ids", "ray_worker_placement",
           "running_allocator_settings", "set_allocator", "share_node_gpus"]
