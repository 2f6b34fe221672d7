"""The interconnect check's arithmetic and lines without Ray (``bus_bandwidth.py``,
``link_speeds.py``), and the start-of-run check on two gloo ranks in processes of their own
(what the training loop's ranks call)."""

from __future__ import annotations

import re
import textwrap

import pytest

from engine_subprocess import rank_group
from preloaded_python import run_python
from vlp.platform.cluster import instance_type as itype
from vlp.platform.cluster import link_speeds
from vlp.platform.cluster.bus_bandwidth import (CPU_BYTES, GPU_BYTES, Measurement,
                                                bus_bandwidth, default_bytes, enabled,
                                                expected_here, run_spans_nodes)


def test_bus_bandwidth_is_nccls_algbw_times_2_n_minus_1_over_n():
    # 1 GB in 1 s over 8 ranks: algbw 1 GB/s, each link carried 2·7/8 of it
    assert bus_bandwidth(1e9, 1.0, 8) == pytest.approx(1.75e9)
    assert bus_bandwidth(1e9, 0.5, 2) == pytest.approx(2e9)      # 2·1/2 = 1: algbw itself
    assert bus_bandwidth(1e9, 1.0, 1) == 0.0                     # one rank moves nothing
    with pytest.raises(ValueError, match="seconds > 0"):
        bus_bandwidth(1e9, 0.0, 2)


def test_the_line_and_the_warning():
    p4d = link_speeds.expected("between", instance_type="p4d.24xlarge")
    ok = Measurement("between", 16, 256 << 20, 0.0125, "nccl", p4d)
    # 268 MB / 12.5 ms × 30/16 = 40.3 GB/s of the 50 GB/s of 4 × 100 Gbit/s EFA
    assert ok.gb_per_s == pytest.approx((256 << 20) / 0.0125 * 30 / 16 / 1e9)
    assert ok.line() == ("interconnect between nodes: all-reduce of 256 MiB over 16 ranks "
                         "(nccl) in 12.5 ms: bus bandwidth 40.27 GB/s, 81% of the 50 GB/s "
                         "the EFA 4 × 100 Gbit/s should give (AWS EC2 P4: 400 Gbit/s)")
    assert ok.warning() is None
    slow = Measurement("between", 16, 256 << 20, 0.2, "nccl", p4d)   # TCP's few GB/s
    warn = slow.warning()
    assert warn.startswith("interconnect WARNING: 2.52 GB/s is 5% of the 50 GB/s expected")
    assert "NCCL_DEBUG=INFO" in warn and "EFA plugin" in warn and "\n" not in warn
    h200 = link_speeds.expected("within", gpu="NVIDIA H200")
    within = Measurement("within", 8, 256 << 20, 0.1, "nccl", h200).warning()
    assert "NCCL_DEBUG=INFO" in within and "NVLink" in within and "EFA plugin" in within
    unknown = Measurement("within", 2, 16 << 20, 0.01, "gloo", None, "CPU ranks (gloo)")
    assert unknown.line().endswith("; expected: unknown (CPU ranks (gloo))")
    assert unknown.warning() is None


def test_switch_and_sizes():
    assert enabled("auto", True, 2) and not enabled("auto", False, 2)
    assert enabled(True, False, 2) and not enabled(False, True, 8)
    assert not enabled(True, True, 1)                     # one worker: nothing to exchange
    assert default_bytes("cuda") == GPU_BYTES == 256 << 20
    assert default_bytes("cpu") == CPU_BYTES and default_bytes("cuda", 64) == 64 << 20
    assert run_spans_nodes(16, 8) and not run_spans_nodes(8, 8)


def test_the_expected_figure_comes_from_the_instance_type_or_the_gpu(monkeypatch, tmp_path):
    import torch

    monkeypatch.setenv(itype.ENV, "g5.12xlarge")
    found, why = expected_here("between", torch.device("cpu"))
    assert found.gb_per_s == 5.0 and why == ""
    monkeypatch.setenv(itype.ENV, "x9.huge")
    assert expected_here("between", torch.device("cpu")) == (
        None, "instance type x9.huge not in the table")
    monkeypatch.delenv(itype.ENV)
    monkeypatch.setattr(itype, "DMI_VENDOR", str(tmp_path / "absent"))   # not on EC2:
    assert itype.instance_type() is None                 # no network call, unknown
    assert "set VLP_INSTANCE_TYPE" in expected_here("between", torch.device("cpu"))[1]
    assert expected_here("within", torch.device("cpu")) == (
        None, "CPU ranks (gloo): no link rate to compare with")
    for name in ("NVIDIA A100-SXM4-40GB", "NVIDIA H200", "NVIDIA A10G", "NVIDIA L4"):
        assert link_speeds.expected("within", gpu=name).gb_per_s > 0
    # every GPU type of cluster.yaml has its instance's network in the table
    for instance in ("g6.2xlarge", "g5.12xlarge", "p4d.24xlarge"):
        assert link_speeds.expected("between", instance_type=instance).source


RANK = textwrap.dedent("""
    import os, sys
    import torch, torch.distributed as dist
    rank, port = int(sys.argv[1]), sys.argv[2]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2)
    from vlp.platform.cluster.bus_bandwidth import start_of_run
    m = start_of_run(True, 1, use_gpu=False, world=2, rank=rank, device=torch.device("cpu"),
                     say=lambda s: print("SAY " + s, flush=True))
    print(f"RANK {rank} {m.seconds!r} {m.nbytes}")
    off = start_of_run("auto", 1, use_gpu=False, world=2, rank=rank,
                       device=torch.device("cpu"), say=print)
    print(f"AUTO {off}")
    dist.destroy_process_group()
""")


def test_start_of_run_on_two_gloo_ranks_says_one_line_on_rank_0():
    """Two ranks on one machine, told they sit on two p5.48xlarge nodes (LOCAL_WORLD_SIZE 1,
    VLP_INSTANCE_TYPE): gloo over loopback is far below EFA's 400 GB/s, so rank 0 says the
    line and the warning; rank 1 says nothing; a CPU run under auto does not run it."""
    with rank_group() as (port, env):
        env = {**env, "LOCAL_WORLD_SIZE": "1", itype.ENV: "p5.48xlarge"}
        procs = run_python(RANK, [[r, port] for r in (0, 1)], env=env, timeout=300)
    for p in procs:
        assert p.returncode == 0, p.stderr[-3000:]
    outs = [(p.stdout, p.stderr) for p in procs]
    said = [line[4:] for line in outs[0][0].splitlines() if line.startswith("SAY ")]
    assert not [line for line in outs[1][0].splitlines() if line.startswith("SAY ")]
    assert len(said) == 2, outs[0][0]
    line, warn = said
    got = re.match(r"interconnect between nodes: all-reduce of 1 MiB over 2 ranks \(gloo\) "
                   r"in ([\d.]+) ms: bus bandwidth ([\d.]+) GB/s, \d+% of the 400 GB/s the "
                   r"EFA 32 × 100 Gbit/s should give", line)
    assert got, line
    ms, gbs = float(got.group(1)), float(got.group(2))
    # the figure is the arithmetic of what was timed: 1 MiB × 2·1/2 ÷ the time
    assert gbs == pytest.approx((1 << 20) / (ms / 1e3) / 1e9, rel=0.05, abs=0.01)
    assert warn.startswith("interconnect WARNING") and "NCCL_DEBUG=INFO" in warn
    assert "AUTO None" in outs[0][0] and "AUTO None" in outs[1][0]
