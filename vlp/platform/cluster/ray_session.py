"""Attach to the Ray cluster a job runs in, or start a private local one sized for the job.

One place decides this for pretrain, finetune and sweep, in this order:

1. an explicit ``address`` argument, else ``RAY_ADDRESS`` (``ray job submit`` sets it):
   ``local`` starts a private instance, anything else is attached to;
2. the cluster that ``ray start`` started on *this node* (``ray up``'s head, a GPU node you
   SSH'd into): Ray records its address in ``<ray temp dir>/ray_current_cluster``; it is
   attached to when a live GCS process of this node serves that address — a stale file left
   by a cluster that died is ignored, and so are private instances other programs started
   with ``ray.init()`` (they run a GCS too, but write no such file);
3. otherwise a new private local instance (``address="local"``), sized for the job.

Each choice is said in one line. Tests and scripts that want a private instance whatever runs
on the machine pass ``address="local"`` (or set ``RAY_ADDRESS=local``): on a shared machine
another user's ``ray start`` would otherwise be found by rule 2.
"""

from __future__ import annotations

import math
import os
import random
import socket
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass

LOCAL = "local"


def worker_env() -> dict[str, str]:
    """Environment for every Ray worker: CUDA's expandable segments, so that the varying
    batch shapes of budget batching do not fragment the caching allocator (a setting the
    user exported wins)."""
    from vlp.platform.training.gpu_placement import allocator_env

    return allocator_env()


# below the kernel's ephemeral ports, above Ray's worker ports (10002-19999 by default)
SERVER_PORTS_FROM = 20000


def free_local_port() -> int:
    """A local TCP port nothing is bound to now, for a server about to bind it: drawn at
    random below the kernel's ephemeral range (``ip_local_port_range``, 32768 up by default).
    Every outgoing connection takes its local port from that range (``make test`` opens
    ~400 a minute: Ray, MLflow and S3 clients), and so does every ``bind`` to port 0, so a
    port found free there can be taken before the server binds it. Falls back to the
    kernel's pick when the range leaves no room below it."""
    top = _ephemeral_low() - 1
    draw = random.SystemRandom()
    for _ in range(100 if top > SERVER_PORTS_FROM else 0):
        port = draw.randint(SERVER_PORTS_FROM, top)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768                    # Linux's default; elsewhere a guess


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class RayChoice:
    address: str            # what ray.init gets: "local" (a new private instance) or a cluster
    why: str                # the one line said about it


def node_cluster_address() -> str | None:
    """The GCS address of the cluster ``ray start`` last started on this node, if its GCS
    still runs here; else None. Reads Ray's own record (``ray_current_cluster`` in the Ray
    temp dir, ``RAY_TMPDIR`` honoured) and its own process scan."""
    from ray._private.services import find_gcs_addresses
    from ray._private.utils import read_ray_address

    recorded = read_ray_address()
    if not recorded:
        return None
    find_gcs_addresses.cache_clear()
    return recorded if recorded in set(find_gcs_addresses()) else None


def choose_address(address: str | None = None, environ: Mapping[str, str] | None = None,
                   node_cluster: Callable[[], str | None] = node_cluster_address) -> RayChoice:
    """Which Ray to use (the rules of the module docstring); starts nothing."""
    env = os.environ if environ is None else environ
    given, source = (address, "address") if address else (env.get("RAY_ADDRESS", ""),
                                                           "RAY_ADDRESS")
    if given == LOCAL:
        return RayChoice(LOCAL, f"{source}={LOCAL}: starting a private local Ray")
    if given:
        return RayChoice(given, f"attaching to the Ray cluster at {source}={given}")
    found = node_cluster()
    if found:
        return RayChoice(found, f"attaching to the Ray cluster running on this node ({found}; "
                                f"RAY_ADDRESS={LOCAL} starts a private one instead)")
    return RayChoice(LOCAL, "no Ray cluster runs on this node: starting a private local Ray")


def ensure_ray(cpus_wanted: float, *, address: str | None = None, dashboard: bool = False,
               log_to_driver: bool = True, configure_logging: bool = False,
               say: Callable[[str], None] = _say) -> None:
    """Attach to the cluster or start a local instance (``choose_address``), saying which.

    ``cpus_wanted``: logical CPUs the job needs at once. A local instance gets at least that
    plus one: Ray Data's list-files task asks for a whole CPU next to the Train workers and
    Ray Train's controller needs a slot, and a 2-core machine deadlocks without the headroom.
    A cluster's resources are the cluster's (``ray.init`` refuses a CPU count there).

    ``dashboard`` (local instance only): also serve the dashboard on 127.0.0.1 and tell every
    worker its address. Ray Train's placement-group cleaner asks the State API (served by the
    dashboard) whether a run's controller is alive; without it the placement groups of Tune
    trials that ASHA stops are never freed, and told nothing the State API guesses a cluster
    and fails on a machine that runs several."""
    import ray

    from vlp.platform.cluster.console import apply as route_worker_output

    if ray.is_initialized():
        return
    choice = choose_address(address)
    if choice.address != LOCAL:
        say(f"[vlp] {choice.why}")
        # RAY_ADDRESS: Ray reads it itself (it may be a job's http:// dashboard address)
        target = {} if choice.address == os.environ.get("RAY_ADDRESS") else {
            "address": choice.address}
        ray.init(**target, log_to_driver=log_to_driver, configure_logging=configure_logging)
        route_worker_output()      # quiet `vlp` commands: workers' output to the run folder
        return
    num_cpus = max(os.cpu_count() or 1, math.ceil(cpus_wanted) + 1)
    say(f"[vlp] {choice.why} ({num_cpus} CPUs)")
    kwargs: dict = dict(address=LOCAL, num_cpus=num_cpus, log_to_driver=log_to_driver,
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
    route_worker_output()


__all__ = ["LOCAL", "RayChoice", "choose_address", "ensure_ray", "free_local_port",
           "node_cluster_address"]
