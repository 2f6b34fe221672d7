"""Pretraining on the general loop: resolve and check the experiment config once, build the
loop's ``LoopConfig`` and tracking spec from it, run the loop on Ray Train workers.

    cfg = load_experiment_config("jobs/configs/x.yaml", overrides=["train.steps=100"])
    result = run_pretraining(cfg, components)          # components: protocols.Components
    result.checkpoint_path, result.final_step, result.history, result.mlflow_run_id

``run_pretraining`` = ``resolve`` + ``preflight`` + ``launch_pretraining``; the pretraining
job (``job.pretrain``) resolves and checks once, with the data, then calls
``launch_pretraining``.
Re-running with the same ``run.name`` and run storage (``run.storage`` / ``$VLP_STORAGE`` /
``run.output_dir``, see ``run_storage``) resumes from the last checkpoint (Ray Train's own
resume) and re-attaches to the same MLflow run.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from vlp.contract.config_loader import flatten, to_yaml
from vlp.platform.cluster import run_storage
from vlp.platform.cluster.job_nodes import scaling_span
from vlp.platform.pretrain.experiment_config import ExperimentConfig
from vlp.platform.tracking.choice import check_tracking_shared, choose_tracking_uri
from vlp.platform.tracking.mlflow_run import check_reachable
from vlp.platform.training import launch
from vlp.platform.training.loop_config import (LoopConfig, LoopOptimizer, LoopScaling, LoopStage,
                                               LoopTrain, project)
from vlp.platform.training.jit_ops_dir import extensions_dir
from vlp.platform.training.launch import LoopResult
from vlp.platform.training.protocols import Components

PretrainResult = LoopResult     # what a pretraining run returns (the loop's result)
# the batch stream as a refusal to resume on another number of workers names it
STREAM = ("this run's batch stream (data.stream: per_worker; a run started with "
          "data.stream: global can move)")


def resolve(cfg: ExperimentConfig) -> ExperimentConfig:
    """A copy with absolute paths (Ray workers and job drivers run in other folders), the
    run storage (``run.storage``, else ``$VLP_STORAGE``, else ``run.output_dir``) and the
    tracking URI (``tracking_choice``) filled in. Whether other nodes must reach them is
    ``check_cluster``'s question, once Ray is attached."""
    root = Path(cfg.run.output_dir).expanduser().resolve()
    storage = run_storage.resolve(cfg.run.storage, cfg.run.output_dir)
    run = cfg.run.model_copy(update=dict(output_dir=str(root), storage=storage.root))
    mlflow = cfg.mlflow.model_copy(update=dict(tracking_uri=choose_tracking_uri(
        cfg.mlflow.tracking_uri, root)))
    train = cfg.train.model_copy(update=dict(
        extensions_dir=extensions_dir(cfg.train.extensions_dir), objective=objective_of(cfg)))
    return cfg.model_copy(update=dict(run=run, mlflow=mlflow, train=train))


def check_cluster(cfg: ExperimentConfig, given_storage: str = "") -> None:
    """Once Ray is attached, before any worker starts: on a job whose workers span nodes
    (``job_nodes.job_span``: the live nodes, or the workers this node cannot hold), a run
    storage or MLflow file store that only this node reaches is refused. ``given_storage``:
    the storage as configured, before ``resolve`` made it absolute (names a relative path)."""
    span = scaling_span(cfg.scaling)
    storage = run_storage.open_location(cfg.run.storage)
    if given_storage and not run_storage.is_uri(given_storage):
        storage = dataclasses.replace(storage, given=given_storage)
    run_storage.check_shared(storage, nodes=span.nodes, why=span.why)
    if cfg.mlflow.enabled:
        check_tracking_shared(cfg.mlflow.tracking_uri, nodes=span.nodes, why=span.why)


def objective_of(cfg: ExperimentConfig) -> str:
    """``train.objective``, or the model family's paper's where it is "" (the default)."""
    if cfg.train.objective:
        return cfg.train.objective
    from vlp.models.families import FAMILIES

    family = FAMILIES.get(cfg.model.family)   # an unknown family is the preflight's to name
    return family.objective if family is not None else "sampled"


def forward_groups_of(cfg: ExperimentConfig) -> tuple[tuple[str, ...], ...]:
    """``train.forward_groups``, or the model family's paper's where it is null."""
    if cfg.train.forward_groups is not None:
        return tuple(tuple(g) for g in cfg.train.forward_groups)
    from vlp.models.families import FAMILIES

    family = FAMILIES.get(cfg.model.family)
    return family.forward_groups if family is not None else ()


def loop_config(cfg: ExperimentConfig) -> LoopConfig:
    """What the general loop reads of an experiment config (resolved, for a run)."""
    return LoopConfig(
        name=cfg.run.name, storage=cfg.run.storage, seed=cfg.run.seed,
        max_failures=cfg.run.max_failures,
        stages=tuple(LoopStage(s.name, s.steps, dict(s.tasks)) for s in cfg.stage_plan()),
        checkpoint_interval=cfg.checkpoint.interval, checkpoint_keep=cfg.checkpoint.keep,
        family=cfg.model.family, batch_input_units=cfg.data.batch_input_units,
        train=project(LoopTrain, cfg.train, objective=objective_of(cfg),
                      forward_groups=forward_groups_of(cfg)),
        optimizer=project(LoopOptimizer, cfg.optimizer,
                          cold_start_steps=cfg.model.cold_start_steps,
                          milestones=tuple(cfg.optimizer.milestones)),
        scaling=project(LoopScaling, cfg.scaling))


def reshardable(cfg: ExperimentConfig) -> bool:
    """Whether a checkpoint of this run resumes on another number of workers: its batch
    stream is global (``data.stream: global``), else each worker's position is its own."""
    return cfg.data.stream == "global"


def tracking_spec(cfg: ExperimentConfig, parent_run_id: str | None = None) -> dict[str, Any]:
    """How rank 0 finds its MLflow run (``launch.tracking_spec``); its params are the
    flattened experiment config."""
    return launch.tracking_spec(
        loop_config(cfg), enabled=cfg.mlflow.enabled, tracking_uri=cfg.mlflow.tracking_uri,
        experiment=cfg.mlflow.experiment, output_dir=cfg.run.output_dir, params=flatten(cfg),
        config_text=to_yaml(cfg), job="pretrain", parent_run_id=parent_run_id,
        metric_window=cfg.mlflow.metric_window)


def preflight(cfg: ExperimentConfig) -> None:
    """Checks that need no cluster: tracking reachable (short timeout), run storage
    writable, and a checkpoint that this run would resume fits the config. Raises with the
    cause named."""
    problem = launch.resume_problem(loop_config(cfg), reshardable=reshardable(cfg),
                                    source=STREAM)
    if problem:
        raise ValueError(problem)
    if cfg.mlflow.enabled:
        check_reachable(cfg.mlflow.tracking_uri, cfg.mlflow.check_timeout_s)
    # last: a command whose input fails a check leaves no folder behind
    run_storage.open_location(cfg.run.storage).create_root()


def run_pretraining(cfg: ExperimentConfig, components: Components, *,
                    parent_run_id: str | None = None,
                    callbacks: list[Any] | None = None) -> PretrainResult:
    """Resolve and check ``cfg``, then run (or resume) it. ``parent_run_id`` nests the
    MLflow run (sweeps); ``callbacks`` are ``ray.train.UserCallback``s (e.g. Tune's
    ``TuneReportCallback``)."""
    given = run_storage.storage_root(cfg.run.storage, cfg.run.output_dir)
    cfg = resolve(cfg)
    preflight(cfg)
    check_cluster(cfg, given)
    return launch_pretraining(cfg, components, parent_run_id=parent_run_id, callbacks=callbacks)


def launch_pretraining(cfg: ExperimentConfig, components: Components, *,
                       parent_run_id: str | None = None,
                       callbacks: list[Any] | None = None) -> PretrainResult:
    """Run (or resume) ``cfg``, already resolved (``resolve``) and checked (``preflight``)."""
    return launch.run_loop(loop_config(cfg), components, tracking_spec(cfg, parent_run_id),
                           callbacks=callbacks)
