"""Tracking the cluster's way (cluster.yaml's head): PostgreSQL behind `mlflow server`, its
artifacts proxied into S3 (moto's server), one stack shared by the module
(``tracking_stack``). A pretraining and a two-trial sweep write to it; the server is killed
mid-pretraining and restarted 20 s later (systemd's restart) and the run goes on; 8 trial
processes write to it at once. Every count is read from the database itself."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pandas as pd
import pytest
from preloaded_python import run_python

REPO = Path(__file__).parents[1]
CONFIG = REPO / "jobs" / "configs" / "pretrain-tiny.yaml"
SWEEP = REPO / "jobs" / "configs" / "sweep-demo.yaml"
RESTART_GAP_S = 20          # the MLflow server down this long (systemd's RestartSec, a crash)


@pytest.fixture(scope="module")
def tracking_stack(s3_server, tmp_path_factory):
    """The cluster's MLflow as cluster.yaml runs it on the head (``tracking_servers``):
    PostgreSQL, ``mlflow server`` over it with artifacts in ``s3://vlp-tracking/mlflow`` on
    the session's moto server; stopped with the module (an idle stack kept to the session's
    end cost ~10 CPU s on a 2-core machine)."""
    from tracking_servers import TrackingStack

    stack = TrackingStack(s3_server, tmp_path_factory.mktemp("tracking"))
    yield stack
    stack.stop()


def pretrain_args(world: str, name: str, uri: str, out: Path, *extra: str) -> list[str]:
    images = Path(world) / "images"
    args = ["pretrain", "--config", str(CONFIG), "--local", "--name", name,
            "--output-dir", str(out), "--tracking-uri", uri]
    for src in ("coco", "vg", "cc", "sbu"):
        args += ["--set", f"data.sources.{src}.path={images / src}"]
    return args + list(extra)


def metric_rows(stack, run_id: str, key: str) -> list[tuple[int, float]]:
    return stack.postgres.query("SELECT step, value FROM metrics WHERE run_uuid = %s AND "
                                "key = %s ORDER BY step", run_id, key)


def s3_keys(stack, prefix: str) -> list[str]:
    import pyarrow.fs as pafs

    fs = stack.s3.filesystem()
    sel = pafs.FileSelector(f"{stack.bucket}/{prefix}", recursive=True, allow_not_found=True)
    return [i.path for i in fs.get_file_info(sel) if i.type == pafs.FileType.File]


def artifact_prefix(stack, run_id: str) -> str:
    """cluster.yaml's layout: s3://$VLP_BUCKET/mlflow/<experiment id>/<run id>/artifacts."""
    (exp,), = stack.postgres.query("SELECT experiment_id FROM runs WHERE run_uuid = %s", run_id)
    return f"mlflow/{exp}/{run_id}/artifacts"


def test_pretraining_and_sweep_write_to_postgres_and_s3(tracking_stack, tiny_world, ray_local,
                                                        tmp_path, monkeypatch, capsys):
    from vlp.cli import main
    from vlp.platform.sweep.run import run_sweep
    from vlp.platform.sweep.sweep_config import load_sweep_config

    stack = tracking_stack
    monkeypatch.chdir(tmp_path)
    steps = 12
    assert main(pretrain_args(tiny_world, "pg-pretrain", stack.uri, tmp_path / "runs",
                              "--steps", str(steps), "--set", "mlflow.metric_window=4",
                              "--set", "train.log_every=4")) == 0
    out = capsys.readouterr().out
    run_id = next(l.split()[1] for l in out.splitlines() if l.startswith("mlflow_run_id"))
    (name, status), = stack.postgres.query("SELECT name, status FROM runs WHERE run_uuid = %s",
                                           run_id)
    assert (name, status) == ("pg-pretrain", "FINISHED")
    params = dict(stack.postgres.query("SELECT key, value FROM params WHERE run_uuid = %s",
                                       run_id))
    assert params["train.steps"] == str(steps) and params["model.family"] == "uniter-tiny"
    assert [s for s, _ in metric_rows(stack, run_id, "loss")] == [4, 8, 12]
    keys = s3_keys(stack, artifact_prefix(stack, run_id))
    for artifact in ("config/experiment.yaml", "config/deepspeed.json",
                     "plots/loss_curve.png", "checkpoint/latest.json"):
        assert f"{stack.bucket}/{artifact_prefix(stack, run_id)}/{artifact}" in keys

    cfg = load_sweep_config(SWEEP, [
        f"world={tiny_world}", f"sweep.output_dir={tmp_path / 'sweeps'}",
        f"mlflow.tracking_uri={stack.uri}", "sweep.name=pg-sweep", "sweep.num_samples=2",
        "sweep.include=[none]", "sweep.include_seeds={}", "sweep.max_concurrent=1",
        "pretrain.train.steps=4", "pretrain.optimizer.warmup_steps=1",
        "pretrain.checkpoint.interval=4", "finetune.benchmarks=[nlvr2]",
        "finetune.overrides=[settings.nlvr2.steps=4]"])
    result = run_sweep(cfg)
    assert result.trials == 2 and result.errors == 0
    children = stack.postgres.query(
        "SELECT r.run_uuid FROM runs r JOIN tags t ON t.run_uuid = r.run_uuid WHERE "
        "t.key = 'mlflow.parentRunId' AND t.value = %s", result.parent_run_id)
    assert len(children) >= 2       # the trials (and their finetunes beneath them)
    parent_keys = s3_keys(stack, artifact_prefix(stack, result.parent_run_id))
    assert (f"{stack.bucket}/{artifact_prefix(stack, result.parent_run_id)}"
            f"/leaderboard/meta_sum.png") in parent_keys


def trained_step(log: Path) -> int:
    """The last step the run's progress lines (``[vlp local] step N, ...``) reached."""
    steps = re.findall(r"^\[vlp local\] step (\d+),", log.read_text(), re.M)
    return int(steps[-1]) if steps else 0


@pytest.mark.timeout(1200)
def test_a_tracking_server_restart_mid_run_loses_no_window(tracking_stack, tiny_world,
                                                           tmp_path):
    """The server killed once the run has logged, up again RESTART_GAP_S later while the
    training goes on: the writes that failed meanwhile wait in the rank-0 queue and are
    delivered after the restart (no replay command needed); one run, every window there.

    The run trains through the outage until two more windows have been written (and failed),
    then is paused (SIGSTOP to its process group) for the rest of the gap and resumed once
    the server answers again: the outage it sees is the same, and the suite does not spend
    the gap's CPU seconds on training steps (before: 2,400 steps to outlast the gap). 160 steps:
    it pauses near step 60-80, and the steps after the restart only carry the queue out."""
    stack = tracking_stack
    window, steps = 20, 160
    out = tmp_path / "runs"
    args = pretrain_args(tiny_world, "restart", stack.uri, out, "--steps", str(steps),
                         "--set", f"mlflow.metric_window={window}",
                         "--set", f"train.log_every={window}",
                         "--set", f"checkpoint.interval={steps}")
    log_path = tmp_path / "pretrain.log"
    log = open(log_path, "w")
    proc = subprocess.Popen([sys.executable, "-m", "vlp.cli", *args], stdout=log,
                            stderr=subprocess.STDOUT, cwd=tmp_path, start_new_session=True,
                            env={**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"})
    paused = False
    try:
        deadline = time.monotonic() + 300
        while not stack.postgres.query("SELECT 1 FROM runs WHERE name = 'restart' AND "
                                       "EXISTS (SELECT 1 FROM metrics m WHERE m.run_uuid = "
                                       "runs.run_uuid)"):
            assert proc.poll() is None, log_path.read_text()[-3000:]
            assert time.monotonic() < deadline, "no metric reached the server in 300 s"
            time.sleep(0.5)
        stack.mlflow.kill()
        killed_at, at_kill = time.monotonic(), trained_step(log_path)
        while trained_step(log_path) < at_kill + 2 * window:   # two windows fail meanwhile
            assert proc.poll() is None, (
                f"the run ended during the outage: {steps} steps are too few here "
                f"(log: {log_path.read_text()[-2000:]})")
            assert time.monotonic() < killed_at + 300, "no training progress in 300 s"
            time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGSTOP)
        paused = True
        paused_at = trained_step(log_path)
        print(f"paused at step {paused_at} of {steps}")
        time.sleep(max(0.0, RESTART_GAP_S - (time.monotonic() - killed_at)))
        stack.mlflow.start()
        os.killpg(proc.pid, signal.SIGCONT)
        paused = False
        assert paused_at < steps, "the run had ended before the server came back"
        assert proc.wait(timeout=900) == 0, log_path.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            if paused:
                os.killpg(proc.pid, signal.SIGCONT)
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=60)
        log.close()
        if stack.mlflow.proc is None:       # a failure above: the next test needs it
            stack.mlflow.start()
    runs = stack.postgres.query("SELECT run_uuid, status FROM runs WHERE name = 'restart'")
    assert len(runs) == 1 and runs[0][1] == "FINISHED"      # not duplicated, closed
    run_id = runs[0][0]
    assert not (out / "restart" / "tracking-undelivered.jsonl").exists()
    # every window logged: one row of its mean at its last step, counted in the database
    logged = len(pd.read_parquet(out / "restart" / "steps"))
    assert logged == steps
    rows = metric_rows(stack, run_id, "loss")
    assert sorted({s for s, _ in rows}) == list(range(window, steps + 1, window))
    assert len(rows) == steps // window          # each delivered once
    printed = log_path.read_text()
    assert "could not be delivered" not in printed


WRITER = textwrap.dedent('''
    import json, sys
    sys.path.insert(0, sys.argv[3])
    from test_tracking_queue import tracker
    from vlp.platform.tracking.rank_zero import RankZeroTracker
    from vlp.platform.training.checkpointing import TrainerState
    uri, name, steps = sys.argv[1], sys.argv[2], int(sys.argv[4])
    base = tracker(uri, sys.argv[5])
    base.queue.close(0)
    spec = {k: v for k, v in base.spec.items() if k != "queue_limit"}
    spec.update(run_name=name, key=name, metric_window=1, experiment="vlp-writers")
    t = RankZeroTracker(spec, base.cfg)
    t.open(None, fresh=True)
    for step in range(1, steps + 1):
        t.add_step({"step": step, "loss": 1.0 / step, "mlm_loss": 2.0})
        if step % 20 == 0:
            t.flush({"examples_per_s": 1.0}, step)
    left = t.close(True, TrainerState(step=steps))
    print(json.dumps({"run_id": t.run_id, "undelivered": len(left),
                      "errors": t.queue.errors}))
''')


def test_eight_trial_processes_write_at_once(tracking_stack, tmp_path):
    stack, steps = tracking_stack, 200
    # eight processes, forked from one that imported MLflow and the tracker (the imports
    # were ~6.8 of each writer's ~8 CPU seconds): each its own client and connections
    procs = run_python(WRITER, [[stack.uri, f"writer-{i}", Path(__file__).parent, steps,
                                 tmp_path / f"w{i}"] for i in range(8)], timeout=600)
    results = []
    for p in procs:
        assert p.returncode == 0, p.stderr[-3000:]
        results.append(json.loads(p.stdout.strip().splitlines()[-1]))
    assert all(r["undelivered"] == 0 and not r["errors"] for r in results), results
    for r in results:
        assert len(metric_rows(stack, r["run_id"], "loss")) == steps
        assert len(metric_rows(stack, r["run_id"], "mlm_loss")) == steps
        assert len(metric_rows(stack, r["run_id"], "examples_per_s")) == steps // 20
    names = [n for n, in stack.postgres.query(
        "SELECT name FROM runs WHERE name LIKE 'writer-%%'")]
    assert sorted(names) == [f"writer-{i}" for i in range(8)]
