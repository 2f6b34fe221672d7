"""``vlp pretrain --local``: the worker side of a job in one process, no Ray (the local
runner standing in for Ray Train's context), end to end on the tiny world: DeepSpeed's real
engine, the local batch stream, the loop's own step, checkpoints to the run folder; stopped
mid-run and resumed, the steps after the resume have the uninterrupted run's losses, exactly.
Each run is a `vlp` process of its own (DeepSpeed's global state stays there); no module of
Ray or MLflow is imported on the way (checked in the process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from no_ray_imports import PRELUDE

pytestmark = pytest.mark.integration

CONFIG = """
run: {{name: tiny-local, output_dir: {out}, seed: 0}}
model: {{family: uniter-tiny, init: random}}
data:
  sources: {{coco: {{path: {world}/images/coco}}}}
  batch_input_units: 512
  bucket_window: 128
tasks: {{itm: 1, mlm: 1, mrfr: 1, mrc-kl: 1}}
train: {{steps: 4, precision: fp32, log_every: 1}}
optimizer: {{lr: 2.0e-3, warmup_steps: 1}}
scaling: {{num_workers: 1}}
checkpoint: {{interval: 2}}
mlflow: {{enabled: false}}
"""

# the CLI, with imports of Ray or MLflow refused (the local path needs neither): one
# `vlp pretrain --local` per JSON argument list, in one process (DeepSpeed's set-up once)
RUN = PRELUDE + textwrap.dedent("""
    import json, sys
    from vlp.cli import main
    for argv in json.loads(sys.argv[1]):
        print("=== RUN", flush=True)
        if main(argv) != 0:
            sys.exit(1)
""")


def _runs(config, *arg_lists):
    argvs = [["pretrain", "--config", str(config), "--local", *a] for a in arg_lists]
    proc = subprocess.run([sys.executable, "-c", RUN, json.dumps(argvs)], capture_output=True,
                          text=True, timeout=900, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc.stdout.split("=== RUN")[1:]


def _losses(run_dir):
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return {r["step"]: r["loss"] for r in map(json.loads, lines)}


def test_local_run_checkpoints_and_resumes_exactly(tiny_world, tmp_path):
    config = tmp_path / "tiny.yaml"
    config.write_text(CONFIG.format(out=tmp_path / "runs", world=tiny_world))
    straight, stopped, resumed = _runs(config, ["--name", "straight"],
                                       ["--name", "cut", "--set", "train.stop_after=3"],
                                       ["--name", "cut"])
    assert "final_step 4" in straight and "completed True" in straight
    assert "[vlp local] step 4, loss" in straight        # a progress line per report
    assert "final_step 3" in stopped
    cut = tmp_path / "runs" / "cut"
    # checkpoints at 2 and 3 (the stop), then 4; checkpoint.keep (2) pruned the oldest
    assert sorted(p.name for p in cut.glob("checkpoint_*")) == [
        "checkpoint_step00000003", "checkpoint_step00000004"]
    assert "resumed from step 3" in resumed and "final_step 4" in resumed
    want = _losses(tmp_path / "runs" / "straight")
    got = _losses(cut)
    assert sorted(want) == [1, 2, 3, 4]
    assert got == want          # steps 1-3 before the cut, step 4 after the resume
    assert not list(cut.glob(".*partial"))
