"""No silent fallback, on a Ray that claims a GPU this machine does not have (`num_gpus=1`,
the way a GPU node with a CPU-only torch looks to Ray): `--gpus 2` is refused before any
actor starts, naming both numbers; `--gpus 1` gets its actor, which sees no CUDA and ends the
job with one line instead of extracting on the CPU while holding the GPU.

Its own Ray in a subprocess (the session's `ray_local` has no GPUs), stopped when it exits."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
from PIL import Image

SCRIPT = textwrap.dedent("""
    import sys
    import ray
    ray.init(address="local", num_cpus=3, num_gpus=1, include_dashboard=False,
             log_to_driver=False, configure_logging=False)
    from vlp.cli import main
    args = ["data", "extract", "--images", sys.argv[1], "--out", sys.argv[2], "--source", "x",
            "--model", "grid-tiny", "--grid", "4", "--short-side", "64", "--long-side", "96"]
    print("EXIT", main(args + ["--gpus", "2"]), flush=True)
    print("EXIT", main(args + ["--gpus", "1"]), flush=True)
    ray.shutdown()
""")


def test_gpu_refusals_with_a_fake_gpu(tmp_path):
    imgs = tmp_path / "imgs"
    imgs.mkdir()
    for i in range(2):
        Image.fromarray(np.full((40, 60, 3), 60 * i, np.uint8)).save(imgs / f"{i}.jpg")
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(imgs), str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=600)
    codes = [ln.split()[1] for ln in proc.stdout.splitlines() if ln.startswith("EXIT ")]
    assert codes == ["2", "1"], proc.stdout + proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("vlp data extract: error")]
    assert len(errors) == 2, proc.stderr
    assert "--gpus 2: the Ray cluster has 1 GPU(s)" in errors[0]
    assert "a model actor was given a GPU but torch sees no CUDA device" in errors[1]
    assert "CUDA_VISIBLE_DEVICES='0'" in errors[1]
    assert not (tmp_path / "out" / "images" / "x").exists() or not list(
        (tmp_path / "out" / "images" / "x").glob("*.parquet"))
