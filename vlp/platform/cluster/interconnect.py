"""Which network a multi-node GPU run's NCCL traffic crosses, said once at start.

NCCL uses EFA (AWS) or InfiniBand when the node has such a device and the libfabric / IB
plugin is loaded; otherwise its gradient all-reduce between nodes runs over TCP sockets,
several times slower than what the GPUs can feed. A run that spans nodes without such a
device says so in one line, so a slow step is not mistaken for a slow model.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

RDMA_DEVICES = "/sys/class/infiniband"     # EFA and InfiniBand devices both appear here


def rdma_devices(folder: str | Path = RDMA_DEVICES) -> list[str]:
    try:
        return sorted(p.name for p in Path(folder).iterdir())
    except OSError:
        return []


def interconnect_line(use_gpu: bool, world: int, local_world: int | None = None,
                      folder: str | Path = RDMA_DEVICES) -> str | None:
    """The line for a GPU run of ``world`` workers, ``local_world`` of them on this node
    (``$LOCAL_WORLD_SIZE``, which Ray Train sets); None for a CPU run or one node."""
    if not use_gpu or world <= 1:
        return None
    local = local_world or int(os.environ.get("LOCAL_WORLD_SIZE", world) or world)
    if local >= world:
        return None
    nodes = math.ceil(world / local)
    devices = rdma_devices(folder)
    if devices:
        return (f"NCCL: {world} workers on {nodes} nodes; this node has "
                f"{len(devices)} EFA/InfiniBand device(s) ({', '.join(devices[:4])})")
    return (f"NCCL: this run spans {nodes} nodes over TCP sockets (no EFA/InfiniBand device "
            f"in {folder}): the gradient all-reduce between nodes is bound by the network; "
            f"cluster.yaml's A100 type has EFA (docs/cluster.md)")
