"""Attach to the Ray cluster a job runs in, or start a local one sized for the job."""

from __future__ import annotations

import os


def ensure_ray(num_workers: int, cpus_per_worker: float) -> None:
    """Inside ``ray job submit`` (or with RAY_ADDRESS set) attach with no arguments; on a
    laptop start a local Ray with logically enough CPUs for the workers plus Ray Train's
    controller (a 2-core machine would otherwise leave a worker unscheduled)."""
    import ray

    if ray.is_initialized():
        return
    if os.environ.get("RAY_ADDRESS"):
        ray.init()
        return
    need = int(num_workers * cpus_per_worker) + 1
    ray.init(num_cpus=max(os.cpu_count() or 1, need), include_dashboard=False,
             log_to_driver=True, configure_logging=False)
