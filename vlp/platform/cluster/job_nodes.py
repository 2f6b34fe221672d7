"""How many nodes a job's workers may run on, asked of the Ray cluster this process is
attached to, before any worker starts.

    span = job_span(workers=8, per_worker={"CPU": 4, "GPU": 1, "accelerator_type:A10G": 0.001})
    span.nodes, span.why          # 2, "this node (CPU 0) cannot hold 8 workers' CPU, GPU: ..."

Counting the nodes alive at submit time is not enough: an autoscaling cluster (``ray up
cluster.yaml``, ``min_workers: 0``) has only its head alive when a job is submitted, and the
head holds no training work (``CPU: 0``), so every worker lands on a node that does not exist
yet. A job spans nodes when the cluster has more than one live node, or when the node this
driver runs on cannot hold all of the job's workers (the autoscaler will start others).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class JobSpan:
    nodes: int          # 1: every worker runs on this process's node
    why: str            # one phrase, for messages


def worker_resources(cpus_per_worker: float, use_gpu: bool,
                     accelerator_type: str = "") -> dict[str, float]:
    """What one Ray Train worker asks for (``launch.scaling_config``'s request; the
    accelerator type as the small share Ray Train asks of ``accelerator_type:<name>``)."""
    out = {"CPU": float(cpus_per_worker)}
    if use_gpu:
        out["GPU"] = 1.0
    if accelerator_type:
        out[f"accelerator_type:{accelerator_type}"] = 0.001
    return out


def job_span(workers: int, per_worker: Mapping[str, float],
             nodes: list[dict] | None = None, here: str | None = None) -> JobSpan:
    """The span of a job of ``workers`` workers each asking ``per_worker``. ``nodes`` /
    ``here`` (``ray.nodes()`` and this process's node id) are read from the attached cluster
    when not given; not attached to Ray: one node (a local run starts its own)."""
    if nodes is None:
        try:
            import ray

            if not ray.is_initialized():
                return JobSpan(1, "not attached to a Ray cluster")
            nodes = ray.nodes()
            here = ray.get_runtime_context().get_node_id()
        except Exception:      # the GCS not answering: the job itself will say so
            return JobSpan(1, "the Ray cluster did not answer")
    alive = [n for n in nodes if n.get("Alive")]
    if len(alive) > 1:
        return JobSpan(len(alive), f"a cluster of {len(alive)} live nodes")
    mine = next((n for n in alive if n.get("NodeID") == here), alive[0] if alive else None)
    have = dict(mine.get("Resources", {})) if mine else {}
    short = sorted(k for k, v in per_worker.items() if v > 0 and have.get(k, 0.0) < v * workers)
    if short:
        held = ", ".join(f"{k} {have.get(k, 0.0):g}" for k in short)
        return JobSpan(2, f"this node ({held}) cannot hold the {workers} worker(s)' "
                          f"{', '.join(short)}: they will run on other nodes (started by the "
                          f"autoscaler)")
    return JobSpan(1, "every worker fits on this node")


def scaling_span(scaling) -> JobSpan:
    """``job_span`` of a config's ``scaling`` section (num_workers, cpus_per_worker, use_gpu,
    accelerator_type)."""
    return job_span(int(scaling.num_workers), worker_resources(
        scaling.cpus_per_worker, scaling.use_gpu, getattr(scaling, "accelerator_type", "")))


__all__ = ["JobSpan", "job_span", "scaling_span", "worker_resources"]
