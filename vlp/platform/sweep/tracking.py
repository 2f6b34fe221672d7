"""The sweep's MLflow runs: a parent run per sweep (written by the driver), a child run per
trial (written by the trial), found again by deterministic keys so that a restored sweep
writes into the same runs.

    sweep parent  (tags vlp.job=sweep, vlp.sweep.mode; artifacts leaderboard/...)
      ├── L10 MLM+ITM+MRC-kl+MRFR   (tags mix, mix_ratios, pretraining_data, init; metrics
      │     │                         per stage + meta_sum, vqa, ir, tr, nlvr2, refcoco_plus)
      │     ├── L10-pretrain          the pretraining run
      │     ├── L10-ft-retrieval      finetune runs
      │     └── ...
      └── ...
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vlp.contract.config_loader import flatten
from vlp.platform.sweep.sweep_config import SweepConfig
from vlp.platform.sweep.point import TrialPoint
from vlp.platform.tracking.mlflow_run import MlflowRun, run_key

SWEEP_JOB = "sweep"
TRIAL_JOB = "sweep-trial"


def artifact_location(tracking_uri: str) -> str | None:
    """Where a new experiment keeps its artifacts. For a SQLite store: beside the database
    (MLflow's default is ./mlruns under whatever folder the process runs in)."""
    if tracking_uri.startswith("sqlite:///"):
        return (Path(tracking_uri[len("sqlite:///"):]).parent / "mlartifacts").as_uri()
    return None


def open_parent_run(cfg: SweepConfig, instance: str) -> MlflowRun:
    """``instance``: the id of this sweep's folder contents (a folder emptied and reused for a
    new sweep gets a new one, so its runs are not confused with the old sweep's)."""
    run = MlflowRun.open(cfg.mlflow.tracking_uri, cfg.mlflow.experiment, run_name=cfg.sweep.name,
                         key=run_key(cfg.sweep_uri, instance, SWEEP_JOB),
                         tags={"vlp.job": SWEEP_JOB, "vlp.sweep.mode": cfg.mode,
                               "vlp.model_family": cfg.model.family},
                         artifact_location=artifact_location(cfg.mlflow.tracking_uri))
    run.log_params({k: v for k, v in flatten(cfg).items() if not k.startswith("mlflow.")})
    run.set_tags({"vlp.state": "running"})
    from vlp.platform.tracking.leaderboard_view import point_view_at

    point_view_at(run.client, run.run_id)      # the MLflow UI's leaderboard view
    return run


def open_trial_run(cfg: SweepConfig, parent_run_id: str, instance: str, name: str,
                   point: TrialPoint, fresh: bool) -> MlflowRun:
    run = MlflowRun.open(cfg.mlflow.tracking_uri, cfg.mlflow.experiment,
                         run_name=f"{name} {point.mix_label()}",
                         key=run_key(cfg.sweep_uri, instance, TRIAL_JOB, name),
                         parent_run_id=parent_run_id,
                         tags={"vlp.job": TRIAL_JOB, "vlp.sweep.trial": name, **point.tags(),
                               **protocol_tags(cfg)},
                         artifact_location=artifact_location(cfg.mlflow.tracking_uri))
    if fresh:
        run.log_params(point.mlflow_params())
    run.set_tags({"vlp.state": "running"})
    return run


def protocol_tags(cfg: SweepConfig) -> dict[str, str]:
    """The model family and the downstream protocol of a trial's finetunes (the leaderboard
    says when its lines mix protocols)."""
    from vlp.platform.sweep.trial_configs import downstream_protocol

    return {"family": cfg.model.family, "downstream_protocol": downstream_protocol(cfg)}


def close_trial_run(tracking_uri: str, run_id: str, status: str, tags: dict[str, Any]) -> None:
    """The driver closes runs of trials it stopped (ASHA) or that died without closing. A run
    the trial closed keeps its status and its tags (its word stands) and gains the tags it
    lacks: the leaderboard view's ``outcome`` column is set by the driver only."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    run = client.get_run(run_id)
    running = run.info.status == "RUNNING"
    for k, v in tags.items():
        if running or k not in run.data.tags:
            client.set_tag(run_id, k, str(v))
    if running:
        client.set_terminated(run_id, status=status)
