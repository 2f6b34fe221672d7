"""One all-reduce timed over a process group, as NCCL's bus bandwidth beside what the link
should give: the line a multi-worker run prints at start (``start_of_run``) and the
figures `vlp doctor` tabulates, one code path for both.

    seconds = timed_all_reduce(256 << 20, device)          # every rank of the group calls it
    m = Measurement("between", ranks=8, nbytes=256 << 20, seconds=seconds,
                    backend="nccl", expected=link_speeds.expected("between", instance_type=...))
    m.line(), m.warning()

Bus bandwidth = algorithm bandwidth (bytes ÷ seconds) × 2(n−1)/n (nccl-tests'
PERFORMANCE.md): the rate each link carried, comparable across rank counts.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any, Callable

from vlp.platform.cluster import link_speeds
from vlp.platform.cluster.link_speeds import LinkSpeed

# buffer sizes when none is configured: a few hundred MB saturates NVLink and EFA (NCCL's
# own tests plateau from ~128 MB); gloo on CPUs copies through host memory, a small buffer
# already shows its rate and keeps the check to a second
GPU_BYTES = 256 << 20
CPU_BYTES = 16 << 20


def bus_bandwidth(nbytes: float, seconds: float, ranks: int) -> float:
    """Bytes per second on each link of an all-reduce of ``nbytes`` over ``ranks`` ranks
    that took ``seconds``."""
    if ranks < 1 or seconds <= 0 or nbytes <= 0:
        raise ValueError(f"bus bandwidth needs ranks ≥ 1, seconds > 0 and bytes > 0; got "
                         f"{ranks}, {seconds}, {nbytes}")
    return nbytes / seconds * 2 * (ranks - 1) / ranks


def default_bytes(device_type: str, configured_mb: int = 0) -> int:
    if configured_mb > 0:
        return configured_mb << 20
    return GPU_BYTES if device_type == "cuda" else CPU_BYTES


def timed_all_reduce(nbytes: int, device: Any, group: Any = None) -> float:
    """Seconds of one sum all-reduce of ``nbytes`` (fp32) over ``group`` (the default group
    when None), after one untimed all-reduce of the same buffer (NCCL builds its
    communicator and gloo connects its pairs on the first) and a barrier, so that every
    rank starts the timed one together. Every rank of the group must call it."""
    import torch
    import torch.distributed as dist

    buf = torch.ones(max(1, nbytes // 4), dtype=torch.float32, device=device)
    dist.all_reduce(buf, group=group)
    _sync(device)
    dist.barrier(group=group)
    t0 = time.perf_counter()
    dist.all_reduce(buf, group=group)
    _sync(device)
    seconds = time.perf_counter() - t0
    del buf
    return seconds


def _sync(device: Any) -> None:
    import torch

    if getattr(device, "type", str(device)) == "cuda":
        torch.cuda.synchronize(device)


@dataclass(frozen=True)
class Measurement:
    scope: str                       # "within" a node or "between" nodes
    ranks: int
    nbytes: int
    seconds: float
    backend: str                     # nccl / gloo
    expected: LinkSpeed | None = None
    unknown_why: str = ""            # why there is no expected figure

    @property
    def gb_per_s(self) -> float:
        return bus_bandwidth(self.nbytes, self.seconds, self.ranks) / 1e9

    @property
    def fraction(self) -> float | None:
        return self.gb_per_s / self.expected.gb_per_s if self.expected else None

    @property
    def low(self) -> bool:
        return self.fraction is not None and self.fraction < link_speeds.WARN_FRACTION

    def line(self) -> str:
        where = "within a node" if self.scope == "within" else "between nodes"
        head = (f"interconnect {where}: all-reduce of {self.nbytes / 2**20:.0f} MiB over "
                f"{self.ranks} ranks ({self.backend}) in {self.seconds * 1e3:.1f} ms: bus "
                f"bandwidth {self.gb_per_s:.2f} GB/s")
        if self.expected is None:
            return f"{head}; expected: unknown ({self.unknown_why or 'not in the table'})"
        return (f"{head}, {self.fraction:.0%} of the {self.expected.gb_per_s:g} GB/s the "
                f"{self.expected.link} should give ({self.expected.source})")

    def warning(self) -> str | None:
        """The line for a measurement well below the link's rate, else None."""
        if not self.low:
            return None
        if self.scope == "between":
            cause = ("NCCL may be on TCP sockets instead of EFA: check that the aws-ofi-nccl "
                     "EFA plugin loads (NCCL_DEBUG=INFO prints 'NET/OFI Selected provider "
                     "is efa', not 'NET/Socket'), FI_PROVIDER=efa and the EFA security group "
                     "(docs/cluster.md)")
        else:
            cause = ("NCCL may not be using NVLink / peer-to-peer: NCCL_DEBUG=INFO prints "
                     "the transport ('P2P/CUMEM' or 'NVLS' on NVLink, 'SHM' through host "
                     "memory); between nodes, the EFA plugin ('NET/OFI')")
        return (f"interconnect WARNING: {self.gb_per_s:.2f} GB/s is {self.fraction:.0%} of "
                f"the {self.expected.gb_per_s:g} GB/s expected; {cause}")


def run_spans_nodes(world: int, local_world: int | None = None) -> bool:
    local = local_world or int(os.environ.get("LOCAL_WORLD_SIZE", world) or world)
    return local < world


def expected_here(scope: str, device: Any) -> tuple[LinkSpeed | None, str]:
    """The table's rate for ``scope`` on this node, or None and why not."""
    from vlp.platform.cluster.instance_type import ENV, instance_type
    from vlp.platform.training.device_peaks import device_name

    if scope == "between":
        itype = instance_type()
        found = link_speeds.expected("between", instance_type=itype)
        return found, ("" if found else f"instance type {itype} not in the table" if itype
                       else f"instance type unknown: not EC2, or set {ENV}")
    gpu = device_name(device)
    found = link_speeds.expected("within", gpu=gpu)
    return found, ("" if found else f"{gpu} not in the table" if gpu
                   else "CPU ranks (gloo): no link rate to compare with")


def enabled(setting: bool | str, use_gpu: bool, world: int) -> bool:
    """``train.interconnect_check``: auto = GPU runs of more than one worker."""
    if world <= 1:
        return False
    return use_gpu if setting == "auto" else bool(setting)


def start_of_run(setting: bool | str, size_mb: int, *, use_gpu: bool, world: int,
                 rank: int, device: Any, say: Callable[[str], None]) -> Measurement | None:
    """The start-of-run check: every rank of the run's default process group calls it; rank
    0 says the line (and the warning). None when switched off."""
    import torch.distributed as dist

    if not enabled(setting, use_gpu, world) or not dist.is_initialized():
        return None
    nbytes = default_bytes(getattr(device, "type", "cpu"), size_mb)
    seconds = timed_all_reduce(nbytes, device)
    scope = "between" if run_spans_nodes(world) else "within"
    expected, why = expected_here(scope, device) if rank == 0 else (None, "")
    m = Measurement(scope, world, nbytes, seconds, dist.get_backend(), expected, why)
    if rank == 0:
        say(m.line())
        warn = m.warning()
        if warn:
            say(warn)
    return m


__all__ = ["Measurement", "bus_bandwidth", "default_bytes", "enabled", "expected_here",
           "run_spans_nodes", "start_of_run", "timed_all_reduce"]
