"""ensure_ray: an explicit address or RAY_ADDRESS first; else the cluster `ray start` runs on
this node (a stale record of a dead one, and other programs' private instances, ignored);
else a private local Ray — each said in one line. The node-cluster case runs a real
`ray start --head` in a Ray temp dir of its own (RAY_TMPDIR), so other clusters on the
machine cannot be found by it."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from vlp.platform.cluster import ray_session
from vlp.platform.cluster.ray_session import (LOCAL, SERVER_PORTS_FROM, choose_address,
                                              free_local_port, node_cluster_address)

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def test_explicit_address_then_ray_address_then_the_nodes_cluster_then_local():
    node = lambda: "10.0.0.5:6379"            # noqa: E731  a cluster runs on this node
    none = lambda: None                       # noqa: E731
    assert choose_address("local", {"RAY_ADDRESS": "1.2.3.4:6379"}, node).address == LOCAL
    assert choose_address("9.9.9.9:6379", {}, node).address == "9.9.9.9:6379"
    c = choose_address(None, {"RAY_ADDRESS": "http://127.0.0.1:8265"}, node)
    assert c.address == "http://127.0.0.1:8265" and "RAY_ADDRESS=http://127.0.0.1:8265" in c.why
    assert choose_address(None, {"RAY_ADDRESS": "local"}, node).address == LOCAL
    c = choose_address(None, {}, node)
    assert c.address == "10.0.0.5:6379" and "running on this node" in c.why
    c = choose_address(None, {}, none)
    assert c.address == LOCAL and "no Ray cluster runs on this node" in c.why


def test_a_stale_record_of_a_dead_cluster_is_ignored(tmp_path, monkeypatch):
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    assert node_cluster_address() is None                       # no record at all
    (tmp_path / "ray").mkdir()
    (tmp_path / "ray" / "ray_current_cluster").write_text(f"127.0.0.1:{free_local_port()}")
    assert node_cluster_address() is None                       # recorded, not running


def test_a_server_port_is_free_and_below_the_ports_outgoing_connections_take(monkeypatch):
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = {free_local_port() for _ in range(20)}
    assert all(SERVER_PORTS_FROM <= p < low for p in ports) and len(ports) > 1
    held_port, other = sorted(ports)[:2]
    draws = iter([held_port, other])

    class Draws:                            # the held port comes up first
        def randint(self, a, b):
            return next(draws)

    monkeypatch.setattr(ray_session.random, "SystemRandom", Draws)
    with socket.socket() as held:
        held.bind(("127.0.0.1", held_port))
        assert free_local_port() == other


@pytest.mark.integration
def test_attaches_to_the_cluster_ray_start_runs_on_this_node():
    from cluster_helpers import stop_tree

    # short: Ray's socket paths under it must stay within 107 bytes
    tmp_path = Path(tempfile.mkdtemp(prefix="vlp-rs-", dir="/tmp"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_ADDRESS")}
    env.update(RAY_TMPDIR=str(tmp_path), RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0",
               PYTHONPATH=str(ROOT))
    port = free_local_port()
    head = subprocess.Popen(
        [str(BIN / "ray"), "start", "--head", "--node-ip-address", "127.0.0.1", "--port",
         str(port), "--num-cpus", "1", "--dashboard-host", "127.0.0.1",
         *[arg for flag in ("--dashboard-port", "--ray-client-server-port",
                            "--dashboard-agent-listen-port",
                            "--dashboard-agent-grpc-port", "--metrics-export-port",
                            "--runtime-env-agent-port")    # other clusters may run here
           for arg in (flag, str(free_local_port()))],
         "--temp-dir", str(tmp_path / "ray"), "--disable-usage-stats"],
        env=env, start_new_session=True, text=True, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT)
    try:
        out, _ = head.communicate(timeout=180)
        assert head.returncode == 0, out
        driver = ("import ray\nfrom vlp.platform.cluster.ray_session import ensure_ray\n"
                  "ensure_ray(1)\nprint(ray.get_runtime_context().gcs_address)\n")
        run = subprocess.run([sys.executable, "-c", driver], env=env, capture_output=True,
                             text=True, timeout=180)
        assert run.returncode == 0, run.stderr[-3000:]
        gcs = (tmp_path / "ray" / "ray_current_cluster").read_text().strip()
        assert gcs.endswith(f":{port}")
        said = [line for line in run.stderr.splitlines() if line.startswith("[vlp]")]
        assert said == [f"[vlp] attaching to the Ray cluster running on this node "
                        f"({gcs}; RAY_ADDRESS=local starts a private one instead)"]
        assert run.stdout.strip().splitlines()[-1] == gcs
    finally:
        stop_tree(head.pid)
        shutil.rmtree(tmp_path, ignore_errors=True)
