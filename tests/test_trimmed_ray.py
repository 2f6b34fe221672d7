"""The recipe `make gpu-wheels` applies to Ray's cp312 wheel (jobs/trim_ray.py), applied to the
local Ray: the trimmed copy, alone first on PYTHONPATH, runs a Ray Data actor-pool job and a
Ray Train job; its three binaries are stripped; what it left out is gone and Train, Data and
Tune are whole."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "jobs"))
import trim_ray  # noqa: E402

RAY_SITE = Path(importlib.util.find_spec("ray").origin).parents[1]


@pytest.fixture(scope="module")
def trimmed(tmp_path_factory):
    into = tmp_path_factory.mktemp("ray-trimmed")
    sizes = trim_ray.trim(RAY_SITE, into)
    assert not list((into / "ray").rglob("__pycache__"))
    # as `make gpu-install` does after unpacking: the job's ~20 Ray processes otherwise each
    # compile the Ray modules they import (PYTHONDONTWRITEBYTECODE; 43 → 28 CPU s)
    subprocess.run([sys.executable, "-m", "compileall", "-q", "-j", "0", str(into / "ray")],
                   check=True, stdout=subprocess.DEVNULL)
    return into, sizes


def test_the_trimming_strips_the_binaries_and_leaves_out_what_vlp_never_imports(trimmed):
    into, sizes = trimmed
    ray_dir = into / "ray"
    for rel in trim_ray.STRIPPED:
        original = (RAY_SITE / "ray" / rel).stat().st_size
        assert (ray_dir / rel).stat().st_size < original, f"{rel} was not stripped"
        assert os.access(ray_dir / rel, os.X_OK) or rel.endswith(".so")
    for gone in trim_ray.DROPPED:
        assert not (ray_dir / gone).exists(), gone
    for kept in ("train/torch", "data", "tune", "dashboard/modules", "_private/runtime_env"):
        assert (ray_dir / kept).is_dir(), kept
    assert list(into.glob("ray-*.dist-info"))
    assert sizes["after_bytes"] < 0.6 * sizes["before_bytes"]


def test_the_trimmed_ray_runs_a_data_actor_pool_and_a_train_job(trimmed, tmp_path):
    into, _ = trimmed
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_ADDRESS")}
    env["PYTHONPATH"] = os.pathsep.join([str(into), str(ROOT)])
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "trimmed_ray_jobs.py"),
                           str(into), str(tmp_path / "storage")],
                          env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "trimmed ray: ok" in proc.stdout


def test_pack_writes_the_archive_whole_or_not_at_all(tmp_path):
    folder = tmp_path / "site"
    (folder / "ray").mkdir(parents=True)
    (folder / "ray" / "x.py").write_text("x = 1\n")
    out = tmp_path / "out" / "ray.tar.xz"
    assert trim_ray.pack(folder, out) == out.stat().st_size
    assert not out.with_name(out.name + ".part").exists()
    with tarfile.open(out) as tar:
        assert tar.getnames() == ["ray", "ray/x.py"]
