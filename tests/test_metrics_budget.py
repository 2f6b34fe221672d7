"""Metrics on a budget: MLflow gets one row per metric every ``mlflow.metric_window`` steps
(the window's mean), every step's record goes to the run's storage as Parquet, and the loss
curve is drawn from that Parquet: closing a run reads no metric back from MLflow."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from vlp.platform.cluster.run_storage import open_location
from vlp.platform.tracking.rank_zero import RankZeroTracker
from vlp.platform.tracking.step_log import StepLog, read_steps
from vlp.platform.training.checkpointing import TrainerState

from test_tracking_queue import tracker

WINDOW = 7


def sqlite(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'mlflow.db'}"


def test_mlflow_gets_window_means_and_parquet_every_step(tmp_path, monkeypatch):
    steps = 1000
    base = tracker(sqlite(tmp_path), tmp_path / "runs")
    base.queue.close(0)
    spec = {k: v for k, v in base.spec.items() if k != "queue_limit"}
    t = RankZeroTracker(dict(spec, metric_window=WINDOW), base.cfg)
    t.open(None, fresh=True)
    for step in range(1, steps + 1):
        record = {"step": step, "stage": 0, "tasks": ["mlm"], "loss": float(step),
                  "lr": 1e-3}
        if step % 2:
            record["mlm_loss"] = 1.0       # a task's loss only on the steps that drew it
        t.add_step(record)
        if step % 50 == 0:
            t.flush({"examples_per_s": 1.0, "examples_seen": step}, step)
    # the loss curve from the Parquet: no metric read back from MLflow at the end
    calls = []
    monkeypatch.setattr(MlflowClient, "get_metric_history",
                        lambda *a, **k: calls.append(a) or [])
    assert t.close(True, TrainerState(step=steps)) == []
    assert calls == []
    monkeypatch.undo()

    client = MlflowClient(sqlite(tmp_path))
    loss = client.get_metric_history(t.run_id, "loss")
    assert len(loss) <= steps / WINDOW + 2
    means = {m.step: m.value for m in loss}
    assert means[7] == pytest.approx(4.0)                # mean of steps 1..7
    assert means[steps] == pytest.approx((995 + 996 + 997 + 998 + 999 + 1000) / 6)  # partial
    assert len(client.get_metric_history(t.run_id, "mlm_loss")) <= steps / WINDOW + 2
    frame = pd.read_parquet(tmp_path / "runs" / "job" / "steps")      # pandas reads it as is
    assert len(frame) == steps and sorted(frame["step"]) == list(range(1, steps + 1))
    assert frame["mlm_loss"].notna().sum() == steps // 2
    art = Path(client.download_artifacts(t.run_id, "plots/loss_curve.png", str(tmp_path)))
    assert art.stat().st_size > 1000


def test_a_resumed_run_rewinds_its_step_log_to_the_checkpoint(tmp_path):
    storage = open_location(str(tmp_path))
    log = StepLog(storage, "run")
    for step in range(1, 26):
        log.add({"step": step, "loss": 1.0})
        if step % 10 == 0:
            log.flush()
    log.flush()                     # parts 1-10, 11-20, 21-25
    again = StepLog(storage, "run")
    again.resume_at(15)             # the checkpoint at 15: steps 16.. are trained again
    assert [(a, b) for a, b, _ in again.parts()] == [(1, 10), (11, 15)]
    for step in range(16, 31):
        again.add({"step": step, "loss": 2.0, "itm_loss": 0.5})
    again.flush()
    frame = read_steps(storage, "run")
    assert list(frame["step"]) == list(range(1, 31))
    assert frame.loc[frame.step > 15, "loss"].eq(2.0).all()
    assert math.isnan(frame.loc[0, "itm_loss"])


def test_vlp_pretrain_local_logs_windows_and_every_step(tiny_world, tmp_path, monkeypatch,
                                                         capsys):
    from vlp.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("VLP_STORAGE", raising=False)
    images = Path(tiny_world) / "images"
    config = Path(__file__).parents[1] / "jobs" / "configs" / "pretrain-tiny.yaml"
    steps = 24
    args = ["pretrain", "--config", str(config), "--local", "--name", "budget",
            "--steps", str(steps), "--set", "mlflow.metric_window=5",
            "--set", "checkpoint.interval=24", "--set", "train.log_every=6"]
    for src in ("coco", "vg", "cc", "sbu"):
        args += ["--set", f"data.sources.{src}.path={images / src}"]
    assert main(args) == 0
    out = capsys.readouterr().out
    run_id = next(line.split()[1] for line in out.splitlines()
                  if line.startswith("mlflow_run_id"))
    client = MlflowClient(f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    assert 0 < len(client.get_metric_history(run_id, "loss")) <= steps / 5 + 2
    assert len(pd.read_parquet(tmp_path / "runs" / "budget" / "steps")) == steps
    names = [a.path for a in client.list_artifacts(run_id, "plots")]
    assert "plots/loss_curve.png" in names
    assert main(["steps", "runs/budget", "--plot", "curve.png"]) == 0
    assert (tmp_path / "curve.png").stat().st_size > 1000
    assert main(["steps", "runs/budget"]) == 0
    assert f"{steps} steps (1..{steps})" in capsys.readouterr().out
