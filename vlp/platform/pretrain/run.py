"""The pretraining driver: checks what can be checked before compute, then runs the loop on
Ray Train workers.

    cfg = load_experiment_config("jobs/configs/x.yaml", overrides=["train.steps=100"])
    result = run_pretraining(cfg, components)          # components: protocols.Components
    result.checkpoint_path, result.final_step, result.history, result.mlflow_run_id

Re-running with the same ``run.name`` and run storage (``run.storage`` / ``$VLP_STORAGE`` /
``run.output_dir``, see ``run_storage``) resumes from the last checkpoint (Ray Train's own
resume) and re-attaches to the same MLflow run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vlp.platform.training import checkpointing
from vlp.contract.config_loader import to_dict
from vlp.platform.training.engine import deepspeed_config, extensions_dir
from vlp.platform.pretrain.config import ExperimentConfig
from vlp.platform.training.protocols import Components
from vlp.platform.cluster import run_storage
from vlp.platform.tracking.mlflow_run import (check_reachable, embedded_artifact_location,
                                   embedded_tracking_uri, run_key)
from vlp.platform.tracking.choice import check_tracking_shared, choose_tracking_uri
from vlp.platform.training.loop import train_loop_per_worker


@dataclass
class PretrainResult:
    run_dir: str                          # Ray Train run folder: checkpoints live here
    checkpoint_path: str | None           # the latest checkpoint (the final one if completed)
    final_step: int
    completed: bool                       # False when stopped by train.stop_after
    history: list[dict[str, Any]]         # per-step records of the last attempt (rank 0)
    mlflow_run_id: str | None
    tracking_uri: str | None
    metrics: dict[str, Any] = field(default_factory=dict)   # Ray's metrics of that checkpoint
    return_value: dict[str, Any] = field(default_factory=dict)


def resolve(cfg: ExperimentConfig) -> ExperimentConfig:
    """A copy with absolute paths (Ray workers and job drivers run in other folders), the
    run storage (``run.storage``, else ``$VLP_STORAGE``, else ``run.output_dir``) and the
    tracking URI (``tracking_choice``) filled in. On a multi-node cluster a storage or
    tracking store that other nodes cannot reach is refused here, before anything starts."""
    root = Path(cfg.run.output_dir).expanduser().resolve()
    storage = run_storage.resolve(cfg.run.storage, cfg.run.output_dir)
    run_storage.check_shared(storage)
    run = cfg.run.model_copy(update=dict(output_dir=str(root), storage=storage.root))
    mlflow = cfg.mlflow.model_copy(update=dict(tracking_uri=choose_tracking_uri(
        cfg.mlflow.tracking_uri, root)))
    if mlflow.enabled:
        check_tracking_shared(mlflow.tracking_uri)
    train = cfg.train.model_copy(update=dict(
        extensions_dir=extensions_dir(cfg.train.extensions_dir)))
    return cfg.model_copy(update=dict(run=run, mlflow=mlflow, train=train))


def tracking_spec(cfg: ExperimentConfig, parent_run_id: str | None = None) -> dict[str, Any]:
    """How rank 0 finds its MLflow run. The key is derived from the storage root and the run
    name (never the job's working folder), so a restarted worker or a re-run driver, also
    one submitted after a code edit, attaches to the same run."""
    uses_embedded = cfg.mlflow.tracking_uri == embedded_tracking_uri(cfg.run.output_dir)
    storage = run_storage.open_location(cfg.run.storage)
    artifacts = None
    if uses_embedded:
        artifacts = (embedded_artifact_location(cfg.run.output_dir) if storage.is_local
                     else storage.uri("mlartifacts"))
    return {
        "enabled": cfg.mlflow.enabled,
        "tracking_uri": cfg.mlflow.tracking_uri,
        "experiment": cfg.mlflow.experiment,
        "run_name": cfg.run.name,
        "key": run_key(cfg.run.storage, cfg.run.name),
        "parent_run_id": parent_run_id,
        "artifact_location": artifacts,
        "storage": cfg.run.storage,
        "deepspeed_config": deepspeed_config(cfg, cfg.scaling.num_workers),
    }


def preflight(cfg: ExperimentConfig) -> None:
    """Checks that need no cluster: tracking reachable (short timeout), run storage
    writable, and a checkpoint that this run would resume fits the config. Raises with the
    cause named."""
    storage = run_storage.open_location(cfg.run.storage)
    storage.create_root()
    if cfg.mlflow.enabled:
        check_reachable(cfg.mlflow.tracking_uri, cfg.mlflow.check_timeout_s)
    meta = storage.latest_checkpoint_meta(cfg.run.name)
    if meta is not None:
        problem = checkpointing.resume_problem(
            meta, [(s.name, s.steps) for s in cfg.stage_plan()], cfg.scaling.num_workers)
        if problem:
            raise ValueError(f"run {cfg.run.name!r} in {storage.root}: {problem}")


def run_pretraining(cfg: ExperimentConfig, components: Components, *,
                    parent_run_id: str | None = None,
                    callbacks: list[Any] | None = None) -> PretrainResult:
    """Run (or resume) the pretraining job described by ``cfg``. ``parent_run_id`` nests the
    MLflow run (sweeps); ``callbacks`` are ``ray.train.UserCallback``s (e.g. Tune's
    ``TuneReportCallback``)."""
    import ray.train

    from vlp.platform.training.fail_once import FailOnceTorchTrainer
    from vlp.platform.training.failures import remove_if_empty, setup_error_of

    cfg = resolve(cfg)
    preflight(cfg)
    spec = tracking_spec(cfg, parent_run_id)
    storage = run_storage.open_location(cfg.run.storage)
    run_dir = storage.uri(cfg.run.name)
    # a set-up error in a worker (config, data, checkpoint) is raised at once, not retried
    trainer = FailOnceTorchTrainer(
        train_loop_per_worker,
        train_loop_config={"config": to_dict(cfg), "components": components, "tracking": spec,
                           "run_dir": run_dir},
        scaling_config=ray.train.ScalingConfig(
            num_workers=cfg.scaling.num_workers, use_gpu=cfg.scaling.use_gpu,
            placement_strategy=cfg.scaling.placement_strategy,
            accelerator_type=cfg.scaling.accelerator_type or None,
            resources_per_worker={"CPU": cfg.scaling.cpus_per_worker,
                                  **({"GPU": 1} if cfg.scaling.use_gpu else {})}),
        run_config=ray.train.RunConfig(
            name=cfg.run.name, **storage.ray_storage(),
            failure_config=ray.train.FailureConfig(max_failures=cfg.run.max_failures),
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=cfg.checkpoint.keep),
            callbacks=callbacks or None),
        datasets=components.datasets(cfg) or None,
        # optional Components.dataset_config(cfg): Ray Train's ingest options (a
        # ray.train.DataConfig, e.g. preserve_order for deterministic streams)
        dataset_config=getattr(components, "dataset_config", lambda c: None)(cfg),
    )
    try:
        result = trainer.fit()
    except BaseException as e:
        _mark_failed(spec)
        remove_if_empty(run_dir)        # no checkpoint yet: leave no folder that looks like a run
        cause = setup_error_of(e)
        if cause is not None:
            raise cause from None       # its one line, not Ray's per-rank report
        raise
    value = result.return_value or {}
    return PretrainResult(
        run_dir=run_dir,
        checkpoint_path=storage.uri(cfg.run.name, Path(result.checkpoint.path).name)
        if result.checkpoint else None,
        final_step=int(value.get("final_step", 0)),
        completed=bool(value.get("completed", False)),
        history=list(value.get("history", [])),
        mlflow_run_id=value.get("mlflow_run_id"),
        tracking_uri=cfg.mlflow.tracking_uri if cfg.mlflow.enabled else None,
        metrics=dict(result.metrics or {}),
        return_value=value,
    )


def _mark_failed(spec: dict[str, Any]) -> None:
    """fit() gave up (retries exhausted, or interrupted): close the job's MLflow run as
    FAILED so the UI does not show it running forever."""
    if not spec["enabled"]:
        return
    try:
        from mlflow.tracking import MlflowClient

        client = MlflowClient(spec["tracking_uri"])
        exp = client.get_experiment_by_name(spec["experiment"])
        if exp is None:
            return
        runs = client.search_runs([exp.experiment_id],
                                  filter_string=f"tags.`vlp.run_key` = '{spec['key']}'",
                                  max_results=1)
        if runs and runs[0].info.status == "RUNNING":
            client.set_terminated(runs[0].info.run_id, status="FAILED")
    except Exception:
        pass  # the training error is the one to show
