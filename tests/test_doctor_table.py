"""`vlp doctor` without Ray: the node plan and process groups from ``ray.nodes()``-shaped
records, the table and its failure lines, the per-node checks' one-line failures (storage
that cannot be written, a tracking server that does not answer), the training step's batch,
and the command's resolution of storage and tracking."""

from __future__ import annotations

import argparse
import socket

from vlp.platform.cluster import doctor_node, link_speeds
from vlp.platform.cluster.bus_bandwidth import Measurement
from vlp.platform.cluster.doctor import CPU_RANKS, _groups, _Node, plan_nodes
from vlp.platform.cluster.doctor_table import COLUMNS, DoctorReport, NodeResult, lines


def _ray_node(node_id, ip, alive=True, **resources):
    return {"NodeID": node_id, "NodeManagerAddress": ip, "Alive": alive,
            "Resources": resources}


def test_the_plan_puts_a_rank_per_gpu_and_two_on_a_cpu_node_head_first():
    nodes = [_ray_node("b" * 56, "10.0.0.7", CPU=48.0, GPU=4.0,
                       **{"accelerator_type:A10G": 1.0}),
             _ray_node("c" * 56, "10.0.0.9", alive=False, CPU=8.0),
             _ray_node("a" * 56, "10.0.0.2", CPU=0.0, **{"node:__internal_head__": 1.0})]
    assert plan_nodes(nodes) == [("a" * 56, "10.0.0.2 aaaaaa (head)", "CPU", CPU_RANKS),
                                 ("b" * 56, "10.0.0.7 bbbbbb", "A10G", 4)]


def test_groups_are_each_nodes_ranks_then_the_nodes_first_ranks():
    def node(ranks):
        return _Node(NodeResult("n"), "id", [object()] * ranks)

    assert _groups([node(2), node(2), node(2)]) == (
        [[0, 1], [2, 3], [4, 5], [0, 2, 4]], [0, 1, 2, -1])
    assert _groups([node(8), node(1)]) == ([list(range(8)), [0, 8]], [0, -1])
    assert _groups([node(1)]) == ([], [])                # one rank: nothing to reduce


def _good(label, **kw):
    return NodeResult(label, ranks=2, within=Measurement("within", 2, 16 << 20, 0.02, "gloo",
                                                         None, "CPU ranks (gloo)"),
                      storage={"ok": True, "write_mb_s": 120.4, "read_mb_s": 310.0},
                      readback={"ok": True}, readback_from="other",
                      tracking={"ok": True, "ms": 3.2},
                      ops={"ok": True, "ops": "none to build (cpu)"}, **kw)


def test_the_table_has_a_row_per_node_and_one_between_them():
    step = {"ok": True, "family": "uniter-tiny", "input_units": 208, "precision": "fp32",
            "step_s": 0.045, "tflops": 0.0029, "mfu": None, "mfu_why": "CPU: no peak"}
    report = DoctorReport("s3://b/runs", "http://head:5000",
                          nodes=[_good("10.0.0.2 aaaaaa (head)", step=step),
                                 _good("10.0.0.7 bbbbbb", step_of="10.0.0.2 aaaaaa (head)")],
                          between=Measurement("between", 2, 16 << 20, 0.01, "gloo", None,
                                              "instance type unknown"))
    out = lines(report)
    rows = [line for line in out if line.startswith("|")]
    assert rows[0] == "| " + " | ".join(COLUMNS) + " |" and len(rows) == 2 + 2 + 1
    head = rows[2].split(" | ")
    assert head[1] == "CPU" and head[2] == "0.84 GB/s (2 gloo ranks, 16 MiB); expected unknown"
    assert head[3] == "120 / 310 MB/s" and head[4] == "ok (other's file)"
    assert head[5] == "ok (3 ms)" and head[6] == "none to build (cpu)"
    assert head[7] == ("uniter-tiny, 208 units, fp32: 45 ms, 0.0029 TFLOP/s, MFU n/a (CPU: "
                       "no peak) |")
    assert "as 10.0.0.2 aaaaaa (head) (same type)" in rows[3]
    assert rows[4].startswith("| between nodes (2) |  | 1.68 GB/s (2 gloo ranks")
    assert out[-1] == "vlp doctor: every check passed" and report.ok
    assert not [line for line in out if line.startswith("FAIL")]


def test_each_failure_is_one_line_naming_the_node_and_what_to_do():
    h200 = link_speeds.expected("within", gpu="NVIDIA H200")
    bad = _good("10.0.0.7 bbbbbb", gpus=8, gpu_name="NVIDIA H200", accelerator="H200")
    bad.within = Measurement("within", 8, 256 << 20, 0.1, "nccl", h200)       # 4.7 GB/s
    bad.storage = {"ok": False, "error": "cannot write the run storage s3://b/runs: denied",
                   "fix": "give this node write access to it"}
    bad.tracking = {"ok": False, "error": "MLflow tracking server http://head:5000 is "
                                          "unreachable", "fix": "start the tracking server"}
    report = DoctorReport("s3://b/runs", "http://head:5000", nodes=[_good("head"), bad])
    out = lines(report)
    fails = [line for line in out if line.startswith("FAIL")]
    assert fails == ["FAIL 10.0.0.7 bbbbbb: cannot write the run storage s3://b/runs: denied; "
                     "give this node write access to it",
                     "FAIL 10.0.0.7 bbbbbb: MLflow tracking server http://head:5000 is "
                     "unreachable; start the tracking server"]
    row = next(line for line in out if line.startswith("| 10.0.0.7"))
    assert "8× NVIDIA H200 (H200)" in row and "| FAIL |" in row and "LOW" in row
    assert any(line.startswith("interconnect WARNING") and "NCCL_DEBUG=INFO" in line
               for line in out)
    assert out[-1] == "vlp doctor: 2 check(s) failed" and not report.ok
    assert lines(report)[-1] == out[-1]          # printed twice, counted once


def test_a_storage_that_cannot_be_written_and_a_tracking_uri_that_does_not_answer(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        w = doctor_node.storage_write(str(ro / "runs"), ".vlp-doctor/x/n", 1024)
    finally:
        ro.chmod(0o700)
    if w["ok"]:                                  # root ignores the mode bits
        w = doctor_node.storage_write("/proc/vlp-doctor/runs", ".vlp-doctor/x/n", 1024)
    assert not w["ok"] and w["error"].startswith("cannot write the run storage ")
    assert "\n" not in w["error"] and "VLP_STORAGE" in w["fix"]
    port = _closed_port()
    t = doctor_node.tracking(f"http://127.0.0.1:{port}", 2.0)
    assert not t["ok"] and "\n" not in t["error"]
    assert t["error"].startswith(f"MLflow tracking server http://127.0.0.1:{port} is "
                                 f"unreachable")
    assert "every node reaches" in t["fix"]
    # written, then read back by another node: the same bytes, or the line saying so
    ok = doctor_node.storage_write(str(tmp_path / "runs"), "d/n1", 4096)
    assert ok["ok"] and ok["write_mb_s"] > 0 and ok["read_mb_s"] > 0
    assert doctor_node.storage_read(str(tmp_path / "runs"), "d/n1", ok["sha256"], "n1")["ok"]
    other = doctor_node.storage_read(str(tmp_path / "elsewhere"), "d/n1", ok["sha256"], "n1")
    assert not other["ok"] and "do not share this storage" in other["fix"]


def test_the_steps_batch_is_a_full_length_mlm_batch():
    from vlp.contract import batch_spec as bs
    from vlp.models.factory import get_family, preprocess_spec
    from vlp.platform.cluster.doctor_step import mlm_batch

    spec = preprocess_spec(get_family("uniter-tiny"), ("mlm",), 2048, 1601)
    b = mlm_batch(spec, 4, 16, 10)
    assert tuple(b[bs.INPUT_IDS].shape) == (4, 16) and tuple(b[bs.REGION_FEATS].shape) == (
        4, 10, 2048)
    assert int(b[bs.INPUT_UNITS]) == 4 * 26 and b[bs.REGION_LOC].shape[-1] == 7
    assert (b[bs.MLM_LABELS] >= 0).any()          # masked by MLM's own policy


def test_the_command_checks_the_storage_and_tracking_a_job_would_use(monkeypatch, tmp_path):
    from vlp.commands.doctor import add_arguments, options

    p = argparse.ArgumentParser()
    add_arguments(p)
    monkeypatch.setenv("VLP_STORAGE", str(tmp_path / "env-runs"))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://head:5000")
    o = options(p.parse_args(["--config", "jobs/configs/pretrain-tiny.yaml"]))
    assert (o.storage, o.tracking_uri) == (str(tmp_path / "env-runs"), "http://head:5000")
    o = options(p.parse_args(["--config", "jobs/configs/pretrain-tiny.yaml",
                              "--set", "mlflow.enabled=false", "--storage", str(tmp_path)]))
    assert (o.storage, o.tracking_uri) == (str(tmp_path), "")      # tracking off: unchecked
    monkeypatch.delenv("VLP_STORAGE")
    o = options(p.parse_args(["--tracking-uri", "http://other:5000", "--no-step"]))
    assert o.storage.endswith("/runs") and o.tracking_uri == "http://other:5000"
    assert not o.step


def _closed_port() -> int:
    """A local port nobody listened on a moment ago (an unreachable server's address)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
