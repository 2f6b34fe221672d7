"""A kept worker group: one Ray actor per rank and their torch.distributed process group,
started once and running one training loop after another (each loop builds its own model
and DeepSpeed engine and destroys it after; the processes, their imports and the process
group stay).

    with WorkerGroup(loop.scaling) as group:
        for loop, components, tracking in runs:
            result = launch.run_loop(loop, components, tracking, group=group)

A Ray Train run starts a controller and its workers (fresh processes importing torch,
DeepSpeed and vlp) and a process group each time; a sweep trial runs 4-9 short
finetunes, so it keeps one group for all of them (``sweep/trial.py``). Each run is still its
own run: its folder and checkpoints in its storage (``group_context``), its MLflow run, its
resume. Faults as under Ray Train's ``FailureConfig``: a set-up error (``failures``) is
raised at once; any other failure restarts the group and the run, at most ``max_failures``
times; a dead actor is a fault.
"""

from __future__ import annotations

import gc
import os
from typing import Any

from vlp.platform.training.failures import SetupError, setup_phase
from vlp.platform.training.loop_config import LoopScaling


class GroupWorker:
    """One rank (a Ray actor: ``ray.remote(GroupWorker)``)."""

    def __init__(self) -> None:
        self.rank = self.world = self.local_rank = 0
        self.device_index = 0       # its GPU among those its node's ranks see
        self._gpus: list[str] = []  # the GPU Ray gave this actor
        self._store: Any = None     # rank 0's: the group's rendezvous, for its life

    def address(self, host_store: bool) -> tuple[str, int, str, list[str]]:
        """(address, port, node id, the GPU Ray gave this actor): with ``host_store`` (rank
        0), the port of the group's rendezvous store, which this actor opens and holds for
        its life (``rendezvous``; ``new_group`` uses it after the group formed); else 0.
        Touches no CUDA."""
        import ray

        from vlp.platform.training.gpu_placement import ray_gpu_ids
        from vlp.platform.training.group_context import node_address
        from vlp.platform.training.rendezvous import open_store

        address = node_address()
        if host_store:
            self._store = open_store(address)
        port = self._store.port if host_store else 0
        self._gpus = ray_gpu_ids()
        return address, port, ray.get_runtime_context().get_node_id(), self._gpus

    def join(self, rank: int, world: int, local_rank: int, local_world: int, address: str,
             port: int, backend: str, visible: list[str] | None = None) -> int:
        """Into the group; ``visible``: the GPUs of this node's ranks, which this process is
        made to see (as Ray Train shares them: NCCL then goes peer to peer between them),
        computing on its own one among them."""
        from vlp.platform.training.gpu_placement import set_allocator, share_node_gpus
        from vlp.platform.training.rendezvous import join_group

        set_allocator()             # before this process's first CUDA allocation
        self.device_index = share_node_gpus(visible or [], self._gpus)
        self.rank, self.world, self.local_rank = rank, world, local_rank
        os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(local_rank),
                          LOCAL_WORLD_SIZE=str(local_world), MASTER_ADDR=address,
                          MASTER_PORT=str(port))
        join_group(backend, address, port, rank, world)
        return os.getpid()

    def placement(self) -> dict[str, Any]:
        """What this rank computes on: its GPU, what it sees, its device index."""
        return {"rank": self.rank, "local_rank": self.local_rank, "gpu_ids": self._gpus,
                "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
                "device_index": self.device_index}

    def run(self, loop_config: dict[str, Any], progress: dict[str, Any]) -> dict[str, Any]:
        """One loop (``loop.train_loop_per_worker``'s body, with this group's context); its
        engine is destroyed after, so the next run's finds the memory free."""
        from vlp.platform.training.group_context import GroupContext
        from vlp.platform.training.loop import _Worker
        from vlp.platform.training.loop_config import LoopConfig

        cfg = loop_config["config"]
        worker = None
        try:
            with setup_phase("worker set-up"):      # an error here is not worth a retry
                if not isinstance(cfg, LoopConfig):
                    raise TypeError(f"loop_config['config'] is a {type(cfg).__name__}, "
                                    f"expected a LoopConfig")
                ctx = GroupContext(self.rank, self.world, self.local_rank, cfg.storage,
                                   cfg.name, cfg.checkpoint_keep, progress, self.device_index)
                worker = _Worker(cfg, {**loop_config, "context": ctx})
            return worker.run()
        finally:
            if worker is not None and worker.engine is not None:
                worker.engine.destroy()
            del worker
            gc.collect()


class WorkerGroup:
    """The driver's handle: ``start()`` (or the first ``run``) starts the actors in a
    placement group of the scaling's bundles and strategy; ``close()`` ends them."""

    gpu_backend = "nccl"   # the process group's on GPUs (gloo: fake GPUs in the tests)

    def __init__(self, scaling: LoopScaling | None = None):
        self.scaling = scaling        # None: the first run's
        self.actors: list[Any] = []
        self.pids: list[int] = []
        self.starts = 0               # groups started so far (a restart after a fault adds one)
        self._pg = None

    def adopt(self, scaling: LoopScaling) -> None:
        """A run of ``scaling`` is about to use the group: the group's own scaling when it
        has none yet; a run of other workers or resources is refused."""
        if self.scaling is None:
            self.scaling = scaling
        elif scaling != self.scaling:
            raise ValueError(f"a run's scaling {scaling} is not the worker group's "
                             f"{self.scaling}")

    def start(self) -> None:
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from vlp.platform.cluster.job_nodes import worker_resources
        from vlp.platform.training.gpu_placement import node_visible

        s = self.scaling
        need = worker_resources(s.cpus_per_worker, s.use_gpu, s.accelerator_type)
        self._pg = placement_group([dict(need)] * s.num_workers,
                                   strategy=s.placement_strategy)
        ray.get(self._pg.ready())
        remote = ray.remote(GroupWorker)
        extra = {k: v for k, v in need.items() if k not in ("CPU", "GPU")}
        self.actors = [remote.options(
            num_cpus=need["CPU"], num_gpus=need.get("GPU", 0), resources=extra or None,
            max_concurrency=1, scheduling_strategy=PlacementGroupSchedulingStrategy(
                self._pg, placement_group_bundle_index=i)).remote()
            for i in range(s.num_workers)]
        addresses = ray.get([a.address.remote(i == 0) for i, a in enumerate(self.actors)])
        nodes = [node for _, _, node, _ in addresses]
        local = [nodes[:i].count(n) for i, n in enumerate(nodes)]
        visible = {n: node_visible(g for _, _, node, gpus in addresses if node == n
                                   for g in gpus) for n in set(nodes)}
        address, port, _, _ = addresses[0]
        backend = self.gpu_backend if s.use_gpu else "gloo"
        self.pids = ray.get([a.join.remote(i, len(self.actors), local[i], nodes.count(nodes[i]),
                                           address, port, backend, visible[nodes[i]])
                             for i, a in enumerate(self.actors)])
        self.starts += 1

    def run(self, loop_config: dict[str, Any], progress: dict[str, Any],
            max_failures: int = 0) -> dict[str, Any]:
        """The loop on every rank; rank 0's return value. A fault restarts the group and the
        run (which resumes from its last checkpoint) up to ``max_failures`` times (-1: no
        limit); a set-up error is raised at once, as its one line."""
        import ray

        failures = 0
        while True:
            if not self.actors:
                self.start()
            try:
                return ray.get([a.run.remote(loop_config, progress) for a in self.actors])[0]
            except Exception as e:
                cause = _setup_error(e)
                self.close()
                if cause is not None:
                    raise cause from None
                failures += 1
                if 0 <= max_failures < failures:
                    raise
                print(f"[vlp] {loop_config['config'].name}: worker group failed "
                      f"({type(e).__name__}); restarting it, attempt {failures + 1}",
                      flush=True)

    def close(self) -> None:
        import ray
        from ray.util.placement_group import remove_placement_group

        for a in self.actors:
            try:
                ray.kill(a)
            except Exception:
                pass          # already gone
        self.actors, self.pids = [], []
        if self._pg is not None:
            try:
                remove_placement_group(self._pg)
            except Exception:
                pass
            self._pg = None

    def __enter__(self) -> "WorkerGroup":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _setup_error(error: BaseException) -> SetupError | None:
    """The ``SetupError`` a rank raised (Ray hands it over wrapped in a ``RayTaskError``,
    the original as its ``cause``)."""
    cause = getattr(error, "cause", None)
    if isinstance(cause, SetupError):
        return cause
    return error if type(error) is SetupError else None
