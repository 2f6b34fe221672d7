"""`vlp doctor`: the cluster checked before a day of GPUs is spent on it, from the Ray
cluster this process is attached to.

Ranks are Ray actors pinned to nodes (``NodeAffinitySchedulingStrategy``, hard): one per GPU
on a GPU node, ``CPU_RANKS`` on a CPU node (no CPU reserved: a busy node still answers).
In order, so that no check's traffic times another's:
1. every rank placed (a node whose GPUs another job holds is a failure after ``timeout_s``);
2. on every node (its first rank): the run storage written and read back (rates), the
   tracking server reached, DeepSpeed's ops loaded; then each node reads back what the next
   node wrote (the storage is shared, not only writable);
3. one process group over every rank (NCCL on GPUs, gloo on CPUs): one timed all-reduce
   within each node of two or more ranks, then one between the nodes' first ranks
   (``bus_bandwidth``: the start-of-run check's code);
4. one training step per node type (``doctor_step``), on the type's first node.
The doctor's files in the storage are deleted at the end.
"""

from __future__ import annotations

import posixpath
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable

from vlp.platform.cluster import bus_bandwidth, link_speeds
from vlp.platform.cluster.bus_bandwidth import Measurement
from vlp.platform.cluster.doctor_table import DoctorReport, NodeResult

CPU_RANKS = 2          # gloo ranks on a CPU node: its within-node all-reduce
FOLDER = ".vlp-doctor"  # under the run storage; removed at the end


@dataclass(frozen=True)
class DoctorOptions:
    storage: str                  # the run storage root, resolved (path or URI)
    tracking_uri: str
    storage_mb: int = 64
    allreduce_mb: int = 0         # 0: bus_bandwidth.default_bytes (256 GPU, 16 CPU)
    family: str = ""              # the step's model; "" = doctor_step's default per device
    step: bool = True
    tracking_timeout_s: float = 5.0
    timeout_s: float = 180.0      # placement of the ranks, and the process group's timeout


@dataclass
class _Node:
    result: NodeResult
    node_id: str
    actors: list[Any]


def plan_nodes(ray_nodes: list[dict]) -> list[tuple[str, str, str, int]]:
    """(node id, label, accelerator type, ranks) per alive node, the head first."""
    out = []
    for n in ray_nodes:
        if not n.get("Alive"):
            continue
        res = n.get("Resources", {})
        head = "node:__internal_head__" in res
        accel = next((k.split(":", 1)[1] for k in res if k.startswith("accelerator_type:")),
                     "")
        gpus = int(res.get("GPU", 0))
        label = f"{n['NodeManagerAddress']} {n['NodeID'][:6]}" + (" (head)" if head else "")
        out.append((n["NodeID"], label, accel or ("GPU" if gpus else "CPU"),
                    gpus if gpus else CPU_RANKS, head))
    out.sort(key=lambda t: (not t[4], t[1]))
    return [t[:4] for t in out]


def run_doctor(opts: DoctorOptions, say: Callable[[str], None] = print) -> DoctorReport:
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from vlp.platform.cluster.doctor_rank import DoctorRank

    report = DoctorReport(storage=opts.storage,
                          tracking=_shown(opts.tracking_uri) if opts.tracking_uri else "off")
    remote = ray.remote(DoctorRank)
    nodes: list[_Node] = []
    for node_id, label, accel, ranks in plan_nodes(ray.nodes()):
        gpu = accel != "CPU"
        actors = [remote.options(
            num_cpus=0, num_gpus=1 if gpu else 0, max_concurrency=1,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)
        ).remote(label) for _ in range(ranks)]
        nodes.append(_Node(NodeResult(label, accelerator=accel, ranks=ranks), node_id, actors))
    say(f"vlp doctor: {sum(len(n.actors) for n in nodes)} rank(s) on {len(nodes)} node(s) …")
    _shared(opts, len(nodes), report)
    session = uuid.uuid4().hex[:12]
    clock = time.perf_counter()

    def done(what: str) -> None:      # each phase's seconds: a slow one shows where
        nonlocal clock
        now = time.perf_counter()
        say(f"vlp doctor: {what} in {now - clock:.1f} s")
        clock = now

    try:
        nodes = _placed(nodes, report, opts.timeout_s)
        done("ranks placed")
        _node_checks(nodes, report, opts, session)
        done("storage, tracking and DeepSpeed ops checked")
        try:
            _all_reduces(nodes, report, opts)
        except ray.exceptions.RayError as e:    # a rank died or a collective timed out
            report.fail("all nodes", f"the all-reduce failed: {_first_line(e)}",
                        "rerun with NCCL_DEBUG=INFO (GPUs) or GLOO_DEBUG (CPUs) set in the "
                        "nodes' environment; check that the nodes reach each other on all "
                        "ports (security group)")
        done("all-reduces timed")
        if opts.step:
            _steps(nodes, report, opts)
            done("training step(s) timed")
    finally:
        for n in nodes:
            for a in n.actors:
                ray.kill(a)
        _clean(opts.storage, session)
    report.nodes = [n.result for n in nodes] + report.nodes    # those not placed last
    return report


def _shared(opts: DoctorOptions, nodes: int, report: DoctorReport) -> None:
    """The jobs' own multi-node rules (a relative storage path, a file tracking store),
    before anything is placed."""
    from vlp.platform.cluster.run_storage import StorageError, check_shared, open_location
    from vlp.platform.tracking.choice import check_tracking_shared
    from vlp.platform.tracking.mlflow_run import TrackingUnreachable

    try:
        check_shared(open_location(opts.storage), nodes)
    except (StorageError, OSError) as e:
        report.fail("all nodes", str(e), "jobs on this cluster would be refused the same way")
    try:
        if opts.tracking_uri:
            check_tracking_shared(opts.tracking_uri, nodes)
    except TrackingUnreachable as e:
        report.fail("all nodes", str(e), "jobs on this cluster would be refused the same way")


def _first_line(e: BaseException) -> str:
    """The cause's last line (a Ray error carries the remote traceback before it)."""
    cause = getattr(e, "cause", None) or e
    text = f"{type(cause).__name__}: {cause}".strip().splitlines()
    return text[-1][:300] if text else type(e).__name__


def _shown(uri: str) -> str:
    from vlp.contract.config_loader import redact

    return redact(uri)


def _placed(nodes: list[_Node], report: DoctorReport, timeout_s: float) -> list[_Node]:
    """The nodes whose every rank started, each rank seeing the GPUs of all the node's ranks
    (``DoctorRank.devices``); the others are failures."""
    import ray

    from vlp.platform.training.gpu_placement import node_visible

    calls = {n.result.label: [a.gpu_ids.remote() for a in n.actors] for n in nodes}
    pending = [c for cs in calls.values() for c in cs]
    ready, _ = ray.wait(pending, num_returns=len(pending), timeout=timeout_s)
    ready = set(ready)
    kept = []
    for n in nodes:
        if all(c in ready for c in calls[n.result.label]):
            ids = [i for c in calls[n.result.label] for i in ray.get(c)]
            visible = node_visible(ids)
            facts = ray.get([a.devices.remote(visible) for a in n.actors])[0]
            n.result.gpus, n.result.gpu_name = facts["gpus"], facts["gpu_name"]
            n.result.instance_type = facts["instance_type"]
            if n.result.accelerator == "GPU" and facts["gpu_name"]:
                n.result.accelerator = facts["gpu_name"]
            kept.append(n)
            continue
        for a in n.actors:
            ray.kill(a)
        what = f"{len(n.actors)} GPU(s)" if n.result.accelerator != "CPU" else "CPU ranks"
        report.nodes.append(n.result)
        report.fail(n.result.label, f"the doctor's {what} were not placed in {timeout_s:.0f} s",
                    "free the node's GPUs (another job holds them) or raise --timeout")
    return kept


def _node_checks(nodes: list[_Node], report: DoctorReport, opts: DoctorOptions,
                 session: str) -> None:
    import ray

    keys = {n.result.label: posixpath.join(FOLDER, session, n.node_id[:12]) for n in nodes}
    first = [n.actors[0] for n in nodes]
    writes = [a.storage_write.remote(opts.storage, keys[n.result.label], opts.storage_mb << 20)
              for a, n in zip(first, nodes)]
    tracks = [a.tracking.remote(opts.tracking_uri, opts.tracking_timeout_s)
              if opts.tracking_uri else None for a in first]     # "": tracking off
    ops = [a.deepspeed_ops.remote() for a in first]
    tracks = [ray.get(t) if t is not None else None for t in tracks]
    for n, w, t, o in zip(nodes, ray.get(writes), tracks, ray.get(ops)):
        n.result.storage, n.result.tracking, n.result.ops = w, t, o
    if len(nodes) < 2:
        return
    reads = []
    for i, n in enumerate(nodes):        # each node reads the next one's file
        writer = nodes[(i + 1) % len(nodes)]
        if not (writer.result.storage or {}).get("ok") or not n.result.storage.get("ok"):
            reads.append(None)
            continue
        n.result.readback_from = writer.result.label
        reads.append(n.actors[0].storage_read.remote(
            opts.storage, keys[writer.result.label], writer.result.storage["sha256"],
            writer.result.label))
    for n, r in zip(nodes, reads):
        if r is not None:
            n.result.readback = ray.get(r)


def _groups(nodes: list[_Node]) -> tuple[list[list[int]], list[int]]:
    """The process group's subgroups: each node's ranks (2 or more), then the nodes' first
    ranks (2 nodes or more); and the node index of each within-node group (-1: between)."""
    groups, owner, rank = [], [], 0
    firsts = []
    for i, n in enumerate(nodes):
        ranks = list(range(rank, rank + len(n.actors)))
        firsts.append(rank)
        if len(ranks) > 1:
            groups.append(ranks)
            owner.append(i)
        rank += len(ranks)
    if len(nodes) > 1:
        groups.append(firsts)
        owner.append(-1)
    return groups, owner


def _all_reduces(nodes: list[_Node], report: DoctorReport, opts: DoctorOptions) -> None:
    import ray

    actors = [a for n in nodes for a in n.actors]
    groups, owner = _groups(nodes)
    for n in nodes:
        if len(n.actors) < 2:
            n.result.within_note = f"n/a: {len(n.actors)} rank on this node"
    if len(nodes) < 2:
        report.between_note = "n/a: one node"
    if not groups:
        return
    master = ray.get(actors[0].address.remote())
    backends = ray.get([a.join.remote(r, len(actors), master, groups, opts.timeout_s)
                        for r, a in enumerate(actors)])
    try:
        for g, (members, node) in enumerate(zip(groups, owner)):
            gpu = backends[members[0]] == "nccl"
            nbytes = bus_bandwidth.default_bytes("cuda" if gpu else "cpu", opts.allreduce_mb)
            seconds = ray.get([actors[r].all_reduce.remote(g, nbytes) for r in members])[0]
            if node >= 0:
                r = nodes[node].result
                expected = link_speeds.expected("within", gpu=r.gpu_name)
                why = ("" if expected else "CPU ranks (gloo)" if not gpu
                       else f"{r.gpu_name} not in the table")
                r.within = Measurement("within", len(members), nbytes, seconds,
                                       backends[members[0]], expected, why)
            else:
                expected, why = _between_expected(nodes)
                report.between = Measurement("between", len(members), nbytes, seconds,
                                             backends[members[0]], expected, why)
    finally:
        ray.get([a.leave.remote() for a in actors])


def _between_expected(nodes: list[_Node]) -> tuple[link_speeds.LinkSpeed | None, str]:
    types = {n.result.instance_type for n in nodes}
    if None in types:
        return None, "instance type unknown on some node: not EC2, or set VLP_INSTANCE_TYPE"
    if len(types) > 1:
        return None, f"mixed instance types {sorted(types)}"
    itype = types.pop()
    found = link_speeds.expected("between", instance_type=itype)
    return found, "" if found else f"instance type {itype} not in the table"


def _steps(nodes: list[_Node], report: DoctorReport, opts: DoctorOptions) -> None:
    """One step per node type (accelerator and GPU name), on its first node."""
    import ray

    firsts: dict[tuple, _Node] = {}
    calls = []
    for n in nodes:
        kind = (n.result.accelerator, n.result.gpu_name)
        if kind in firsts:
            n.result.step_of = firsts[kind].result.label
            continue
        firsts[kind] = n
        calls.append((n, n.actors[0].training_step.remote(opts.family)))
    for n, call in calls:
        try:
            n.result.step = ray.get(call)
        except ray.exceptions.RayError as e:     # the rank died: out of memory, a crash
            n.result.step = {"ok": False, "error": f"the training step's rank died: "
                                                   f"{_first_line(e)}",
                             "fix": "look at the node's raylet log (out of memory?); "
                                    "`make gpu-check` on this node type"}


def _clean(storage: str, session: str) -> None:
    from vlp.platform.cluster.run_storage import StorageError, open_location

    try:
        s = open_location(storage)
        s.fs.delete_dir(s.fs_path(FOLDER, session))
        if s.is_local and not s.subfolders(FOLDER):     # no other doctor's files in it
            s.fs.delete_dir(s.fs_path(FOLDER))
    except (OSError, StorageError, ValueError):
        pass     # nothing was written (the write failed: reported), or no access


__all__ = ["CPU_RANKS", "DoctorOptions", "plan_nodes", "run_doctor"]
