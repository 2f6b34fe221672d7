"""One rank of `vlp doctor`: a Ray actor pinned to a node (one per GPU there, two on a CPU
node), which joins the doctor's process group for the all-reduces and, as its node's first
rank, runs that node's checks (``doctor_node``) and the training step (``doctor_step``).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from vlp.platform.cluster import doctor_node, doctor_step


class DoctorRank:
    def __init__(self, node: str):
        self.node = node
        self.groups: list[Any] = []
        self.rank = -1
        self.index = 0          # this rank's CUDA device among those it sees
        self._store: Any = None  # rank 0's: the process group's rendezvous

    @property
    def device(self) -> Any:
        import torch

        return (torch.device("cuda", self.index) if torch.cuda.is_available()
                else torch.device("cpu"))

    # ---- placement: the GPUs of a node shared as Ray Train shares them -----------------

    def gpu_ids(self) -> list[str]:
        """The GPU Ray gave this actor (none on a CPU node); touches no CUDA."""
        from vlp.platform.training.gpu_placement import ray_gpu_ids

        return ray_gpu_ids()

    def devices(self, visible: list[str]) -> dict[str, Any]:
        """The node's facts, once this rank sees ``visible`` (the GPUs of every doctor rank
        on the node, as Ray Train sets ``CUDA_VISIBLE_DEVICES`` for a node's workers: NCCL
        then uses peer-to-peer between them) and computes on its own one among them.
        Called before CUDA starts in this process."""
        from vlp.platform.training.gpu_placement import set_allocator, share_node_gpus

        set_allocator()   # a GPU process vlp starts, as the training ones
        self.index = share_node_gpus(visible, self.gpu_ids())
        return doctor_node.devices(self.index)

    # ---- the process group -----------------------------------------------------------

    def address(self) -> tuple[str, int]:
        """This node's address and the port of the group's rendezvous store, which this
        actor opens and holds for its life (``rendezvous``; ``join``'s groups use it)."""
        import ray

        from vlp.platform.training.rendezvous import open_store

        ip = ray.util.get_node_ip_address()
        self._store = open_store(ip)
        return ip, self._store.port

    def join(self, rank: int, world: int, master: tuple[str, int], groups: list[list[int]],
             timeout_s: float) -> str:
        """Into the doctor's default group (NCCL where this rank has a GPU, else gloo), then
        every group of ``groups`` created (every rank creates each, in the same order)."""
        import torch
        import torch.distributed as dist

        from vlp.platform.training.rendezvous import join_group

        gpu = torch.cuda.is_available()
        if gpu:
            torch.cuda.set_device(self.index)
        backend = "nccl" if gpu else "gloo"
        join_group(backend, master[0], master[1], rank, world, timedelta(seconds=timeout_s))
        self.rank = rank
        self.groups = [dist.new_group(g) for g in groups]
        return backend

    def all_reduce(self, index: int, nbytes: int) -> float:
        """Seconds of one timed all-reduce over group ``index`` (its members call it)."""
        from vlp.platform.cluster.bus_bandwidth import timed_all_reduce

        return timed_all_reduce(nbytes, self.device, self.groups[index])

    def leave(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()

    # ---- the node's checks --------------------------------------------------------------

    def storage_write(self, root: str, key: str, nbytes: int) -> dict[str, Any]:
        return doctor_node.storage_write(root, key, nbytes)

    def storage_read(self, root: str, key: str, sha256: str, writer: str) -> dict[str, Any]:
        return doctor_node.storage_read(root, key, sha256, writer)

    def tracking(self, uri: str, timeout_s: float) -> dict[str, Any]:
        return doctor_node.tracking(uri, timeout_s)

    def deepspeed_ops(self) -> dict[str, Any]:
        return doctor_node.deepspeed_ops()

    def training_step(self, family: str) -> dict[str, Any]:
        try:
            return {"ok": True, **doctor_step.training_step(family, device=self.device)}
        except Exception as e:  # noqa: BLE001 - the step failing on this node is the finding
            return {"ok": False, "error": f"the training step failed: {type(e).__name__}: "
                                          f"{str(e)[:300]}",
                    "fix": "run `make gpu-check` on this node type for the full picture"}
