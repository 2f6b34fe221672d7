"""The line a multi-node GPU run says at start about the network NCCL crosses."""

from __future__ import annotations

from vlp.platform.cluster.interconnect import interconnect_line


def test_a_gpu_run_spanning_nodes_without_efa_says_it_runs_over_tcp(tmp_path):
    none = tmp_path / "infiniband"               # absent: no EFA / InfiniBand device
    line = interconnect_line(True, 16, 8, folder=none)
    assert line.startswith("NCCL: this run spans 2 nodes over TCP sockets")
    assert "\n" not in line and "EFA" in line
    efa = tmp_path / "efa"
    for name in ("rdmap16s27", "rdmap32s27"):
        (efa / name).mkdir(parents=True)
    assert "2 EFA/InfiniBand device(s) (rdmap16s27, rdmap32s27)" in interconnect_line(
        True, 16, 8, folder=efa)
    # one node, one worker, or a CPU run: nothing to say
    assert interconnect_line(True, 8, 8, folder=none) is None
    assert interconnect_line(True, 1, folder=none) is None
    assert interconnect_line(False, 16, 8, folder=none) is None


def test_local_world_size_comes_from_ray_trains_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert "spans 2 nodes" in interconnect_line(True, 8, folder=tmp_path / "none")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    assert interconnect_line(True, 8, folder=tmp_path / "none") is None
