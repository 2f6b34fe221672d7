"""Attach to the Ray cluster a job runs in, or start a private local one sized for the job.

One place decides this for pretrain, finetune and sweep. Two rules:

* Inside ``ray job submit`` (Ray sets RAY_ADDRESS) attach with a bare ``ray.init()``: the
  cluster's resources are the cluster's, not ours to size.
* Anywhere else start a *new* local instance (``address="local"``). A bare ``ray.init()``
  would attach to whatever ``/tmp/ray/ray_current_cluster`` names, a stale file from a
  cluster that died or another user's ``ray start`` included, and then refuses our CPU
  count ("When connecting to an existing cluster, num_cpus ... must not be provided").
"""

from __future__ import annotations

import math
import os
import socket


def worker_env() -> dict[str, str]:
    """Environment for every Ray worker: CUDA's expandable segments, so that the varying
    batch shapes of budget batching do not fragment the caching allocator (a setting the
    user exported wins)."""
    return {"PYTORCH_CUDA_ALLOC_CONF": os.environ.get("PYTORCH_CUDA_ALLOC_CONF",
                                                      "expandable_segments:True")}


def free_local_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ensure_ray(cpus_wanted: float, *, dashboard: bool = False, log_to_driver: bool = True,
               configure_logging: bool = False) -> None:
    """``cpus_wanted``: logical CPUs the job needs at once. The local instance gets at least
    that plus one: Ray Data's list-files task asks for a whole CPU next to the Train workers
    and Ray Train's controller needs a slot, and a 2-core machine deadlocks without the
    headroom.

    ``dashboard``: also serve the dashboard on 127.0.0.1 and tell every worker its address.
    Ray Train's placement-group cleaner asks the State API (served by the dashboard) whether a
    run's controller is alive; without it the placement groups of Tune trials that ASHA stops
    are never freed, and told nothing the State API guesses a cluster and fails on a machine
    that runs several."""
    import ray

    if ray.is_initialized():
        return
    if os.environ.get("RAY_ADDRESS"):
        ray.init()
        return
    num_cpus = max(os.cpu_count() or 1, math.ceil(cpus_wanted) + 1)
    kwargs: dict = dict(address="local", num_cpus=num_cpus, log_to_driver=log_to_driver,
                        configure_logging=configure_logging)
    env_vars = worker_env()
    if dashboard:
        port = free_local_port()
        env_vars.update({"RAY_ADDRESS": f"http://127.0.0.1:{port}",
                         "RAY_DATA_DISABLE_PROGRESS_BARS": "1"})
        kwargs.update(include_dashboard=True, dashboard_host="127.0.0.1", dashboard_port=port)
    else:
        kwargs.update(include_dashboard=False)
    kwargs.update(runtime_env={"env_vars": env_vars})
    ray.init(**kwargs)
