"""The general training loop on Ray Train workers: one ``LoopConfig`` and the job's
``Components`` in, a ``LoopResult`` out. Pretraining (``pretrain/run.py``) and finetuning
(``finetune/run.py``) each resolve and check their own config once, build a ``LoopConfig``
and a tracking spec, and call ``run_loop``.

Re-running with the same run name and storage resumes from the last checkpoint (Ray Train's
own resume) and re-attaches to the same MLflow run (the spec's ``key``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from vlp.platform.cluster import run_storage
from vlp.platform.tracking.mlflow_run import (embedded_artifact_location, embedded_tracking_uri,
                                              run_key)
from vlp.platform.training import checkpointing
from vlp.platform.training.loop_config import LoopConfig, LoopScaling
from vlp.platform.training.engine import deepspeed_config
from vlp.platform.training.loop import train_loop_per_worker
from vlp.platform.training.protocols import Components


@dataclass
class LoopResult:
    run_dir: str                          # Ray Train run folder: checkpoints live here
    checkpoint_path: str | None           # the latest checkpoint (the final one if completed)
    final_step: int
    completed: bool                       # False when stopped by train.stop_after
    history: list[dict[str, Any]]         # per-step records of the last attempt (rank 0)
    mlflow_run_id: str | None
    tracking_uri: str | None
    metrics: dict[str, Any] = field(default_factory=dict)   # Ray's metrics of that checkpoint
    return_value: dict[str, Any] = field(default_factory=dict)


def tracking_spec(loop: LoopConfig, *, enabled: bool, tracking_uri: str, experiment: str,
                  output_dir: str, params: dict[str, str], config_text: str, job: str,
                  parent_run_id: str | None = None,
                  metric_window: int | None = None) -> dict[str, Any]:
    """How rank 0 finds and fills its MLflow run. The key is derived from the storage root
    and the run name (never the job's working folder), so a restarted worker or a re-run
    driver, also one submitted after a code edit, attaches to the same run. ``params`` and
    ``config_text`` are the job's own config (flattened, as YAML): the run records what the
    user wrote, not the loop's projection of it. ``metric_window``: steps per MLflow row
    (window means; None = ``rank_zero.METRIC_WINDOW``)."""
    uses_embedded = tracking_uri == embedded_tracking_uri(output_dir)
    storage = run_storage.open_location(loop.storage)
    artifacts = None
    if uses_embedded:
        artifacts = (embedded_artifact_location(output_dir) if storage.is_local
                     else storage.uri("mlartifacts"))
    return {
        "enabled": enabled,
        "tracking_uri": tracking_uri,
        "experiment": experiment,
        "run_name": loop.name,
        "key": run_key(loop.storage, loop.name),
        "parent_run_id": parent_run_id,
        "artifact_location": artifacts,
        "storage": loop.storage,
        "metric_window": metric_window,
        "deepspeed_config": deepspeed_config(loop, loop.scaling.num_workers),
        "params": params,
        "config_text": config_text,
        "tags": {"vlp.job": job, "vlp.model_family": loop.family},
    }


def resume_problem(loop: LoopConfig, reshardable: bool = False,
                   source: str = "this run's batch stream") -> str | None:
    """Why the checkpoint this run would resume from does not fit ``loop`` (other stages,
    a worker count its global batch does not divide over, a ZeRO stage that cannot load its
    optimizer state), or None (no checkpoint, or one that fits): on the driver, before any
    worker starts. ``reshardable``: the run's batch source can move its position to another
    number of workers (``load_resharded_state``: pretraining's ``data.stream: global``; the
    per-worker streams and finetuning's cannot), ``source`` names it in the refusal."""
    storage = run_storage.open_location(loop.storage)
    meta = storage.latest_checkpoint_meta(loop.name)
    if meta is None:
        return None
    meta["zero_stage"] = checkpointing.saved_zero_stage(
        meta, run_storage.open_location(meta["uri"]).exists)
    problem = checkpointing.resume_problem(meta, loop.stage_steps(), loop.scaling.num_workers,
                                           loop.train.zero_stage, loop.train.grad_accum,
                                           reshardable, source)
    return f"run {loop.name!r} in {storage.root}: {problem}" if problem else None


def run_loop(loop: LoopConfig, components: Components, tracking: dict[str, Any], *,
             callbacks: list[Any] | None = None, group: Any = None) -> LoopResult:
    """Run (or resume) ``loop`` on Ray Train workers, or on ``group`` (a kept
    ``worker_group.WorkerGroup`` of the same scaling, for a job without Ray Data datasets).
    The caller has resolved and checked its config (storage, tracking store, resume);
    ``callbacks`` are ``ray.train.UserCallback``s (e.g. Tune's ``TuneReportCallback``; on a
    group, a ``ProgressPrinter``'s line is printed by rank 0)."""
    import ray.train

    storage = run_storage.open_location(loop.storage)
    run_dir = storage.uri(loop.name)
    if group is not None:
        return _run_on_group(loop, components, tracking, callbacks or [], group, storage)
    result = fit_once(dict(
        train_loop_per_worker=train_loop_per_worker,
        train_loop_config={"config": loop, "components": components, "tracking": tracking,
                           "run_dir": run_dir},
        scaling_config=scaling_config(loop.scaling),
        run_config=ray.train.RunConfig(
            name=loop.name, **storage.ray_storage(),
            failure_config=ray.train.FailureConfig(max_failures=loop.max_failures),
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=loop.checkpoint_keep),
            callbacks=callbacks or None),
        datasets=components.datasets(loop) or None,
        # optional Components.dataset_config(loop): Ray Train's ingest options (a
        # ray.train.DataConfig, e.g. preserve_order for deterministic streams)
        dataset_config=getattr(components, "dataset_config", lambda c: None)(loop),
    ), run_dir, on_failure=lambda: _mark_failed(tracking))
    value = result.return_value or {}
    return LoopResult(
        run_dir=run_dir,
        checkpoint_path=storage.uri(loop.name, Path(result.checkpoint.path).name)
        if result.checkpoint else None,
        final_step=int(value.get("final_step", 0)),
        completed=bool(value.get("completed", False)),
        history=list(value.get("history", [])),
        mlflow_run_id=value.get("mlflow_run_id"),
        tracking_uri=tracking["tracking_uri"] if tracking["enabled"] else None,
        metrics=dict(result.metrics or {}),
        return_value=value,
    )


def _run_on_group(loop: LoopConfig, components: Components, tracking: dict[str, Any],
                  callbacks: list[Any], group: Any, storage: Any) -> LoopResult:
    from vlp.platform.training.failures import remove_if_empty
    from vlp.platform.training.progress import ProgressPrinter

    group.adopt(loop.scaling)
    if components.datasets(loop):
        raise ValueError(f"run {loop.name!r} reads Ray Data datasets: it needs a Ray Train "
                         f"run of its own, not a kept worker group")
    run_dir = storage.uri(loop.name)
    printer = next((c for c in callbacks if isinstance(c, ProgressPrinter)), None)
    progress = {"total_steps": printer.total_steps if printer else loop.total_steps(),
                "stage_names": printer.stage_names if printer else [s.name for s in loop.stages],
                "job": printer.job if printer else loop.job, "run": loop.name}
    try:
        value = group.run({"config": loop, "components": components, "tracking": tracking,
                           "run_dir": run_dir}, progress, max_failures=loop.max_failures) or {}
    except BaseException:
        _mark_failed(tracking)
        remove_if_empty(run_dir)
        raise
    meta = storage.latest_checkpoint_meta(loop.name)
    return LoopResult(
        run_dir=run_dir, checkpoint_path=meta["uri"] if meta else None,
        final_step=int(value.get("final_step", 0)),
        completed=bool(value.get("completed", False)),
        history=list(value.get("history", [])), mlflow_run_id=value.get("mlflow_run_id"),
        tracking_uri=tracking["tracking_uri"] if tracking["enabled"] else None,
        metrics={}, return_value=value)


def scaling_config(s: LoopScaling) -> Any:
    import ray.train

    return ray.train.ScalingConfig(
        num_workers=s.num_workers, use_gpu=s.use_gpu, placement_strategy=s.placement_strategy,
        accelerator_type=s.accelerator_type or None,
        resources_per_worker={"CPU": s.cpus_per_worker, **({"GPU": 1} if s.use_gpu else {})})


def fit_once(trainer_kwargs: dict[str, Any], run_dir: str,
             on_failure: Callable[[], None] | None = None) -> Any:
    """``FailOnceTorchTrainer(**trainer_kwargs).fit()``, the one way every vlp job starts Ray
    Train workers: a set-up error in a worker (config, data, checkpoint) ends the run at once
    and is raised as its one line, not retried; a run folder left without a checkpoint is
    removed, so a run that never trained does not look like one."""
    from vlp.platform.training.fail_once import FailOnceTorchTrainer
    from vlp.platform.training.failures import remove_if_empty, setup_error_of

    trainer = FailOnceTorchTrainer(**trainer_kwargs)
    try:
        return trainer.fit()
    except BaseException as e:
        if on_failure is not None:
            on_failure()
        remove_if_empty(run_dir)
        cause = setup_error_of(e)
        if cause is not None:
            raise cause from None       # its one line, not Ray's per-rank report
        raise


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
