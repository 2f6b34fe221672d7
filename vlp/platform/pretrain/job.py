"""The pretraining job: an experiment config in; a trained checkpoint, its metrics and its
MLflow run out. What ``jobs/pretrain.py``, ``vlp pretrain`` and sweeps call::

    cfg = load_pretrain_config("jobs/configs/pretrain-tiny.yaml", ["train.steps=40"])
    result = pretrain(cfg, parent_run_id=None)   # vlp.platform.pretrain.run.PretrainResult
    result.checkpoint_path, result.metrics["loss"], result.mlflow_run_id

Every check runs before Ray Train starts a worker (config keys and values, model family,
task names and their fit to the family, source folders and shard footers, the MLflow
store). Re-running with the same ``run.name`` and ``run.output_dir`` resumes the job.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from vlp.platform.cluster import run_storage
from vlp.platform.cluster.run_storage import is_uri, storage_root
from vlp.platform.pretrain.experiment_config import ExperimentConfig, load_experiment_config
from vlp.platform.pretrain.run import (PretrainResult, check_cluster, launch_pretraining,
                                       objective_of, preflight, resolve)
from vlp.platform.pretrain.components import PretrainComponents
from vlp.platform.pretrain.data import PretrainSetup, prepare
from vlp.platform.training import objective
from vlp.platform.training.engine import zero_stage

ESTIMATE_BATCHES = 8        # batches read on the driver to estimate examples per step


def load_pretrain_config(path: str | Path | None = None, overrides: Iterable[str] = (), *,
                         data: dict | None = None) -> ExperimentConfig:
    """Load and validate against the model registry (task names, families)."""
    from vlp.models import list_families
    from vlp.tasks import task_names

    return load_experiment_config(path, overrides, data=data, task_names=task_names(),
                                  families=list_families())


def pretrain(cfg: ExperimentConfig, *, parent_run_id: str | None = None,
             callbacks: Sequence[Any] = (), progress: bool = True,
             say: Callable[[str], None] = print,
             start_ray: Callable[[], None] | None = None) -> PretrainResult:
    """Run (or resume) the pretraining job ``cfg`` on the Ray cluster this process is
    attached to. ``parent_run_id`` nests its MLflow run (sweeps); ``callbacks`` are extra
    ``ray.train.UserCallback``s (Tune's ``TuneReportCallback``); ``progress`` prints a line
    per report; ``start_ray`` attaches to or starts Ray once every check has passed (a bad
    config or checkpoint then fails before any Ray process exists); once attached, storage
    and tracking that other nodes cannot reach are refused (``run.check_cluster``), before
    any worker starts."""
    given_storage = storage_root(cfg.run.storage, cfg.run.output_dir)
    cfg = resolved(cfg)             # once per job: launch_pretraining neither resolves nor checks
    setup = prepare(cfg)            # ConfigError naming every bad key, before any compute
    # tracking store reachable, resumable checkpoint fits: before the summary reads data and
    # builds the model
    preflight(cfg)
    for line in summary(cfg, setup):
        say(f"[vlp pretrain] {line}")
    extra = list(callbacks)
    if progress:
        from vlp.platform.training.progress import ProgressPrinter

        extra.insert(0, ProgressPrinter(cfg.total_steps(), [s.name for s in setup.stages]))
    if start_ray is not None:
        start_ray()
    check_cluster(cfg, given_storage)
    return launch_pretraining(cfg, PretrainComponents(setup), parent_run_id=parent_run_id,
                              callbacks=extra)


def finished_run(cfg: ExperimentConfig) -> str | None:
    """One line when the run ``cfg`` names has already ended at its last configured step (a
    re-run with the same ``run.name`` and storage would start workers only to load that
    checkpoint and stop); None otherwise: no checkpoint, one before the last step, or one
    that does not fit the config (the preflight then names why). The MLflow run is found by
    its key, as a resumed job re-attaches to it; nothing is written."""
    from vlp.platform.pretrain.run import STREAM, loop_config, reshardable
    from vlp.platform.training import launch

    cfg = resolved(cfg)
    loop = loop_config(cfg)
    storage = run_storage.open_location(cfg.run.storage)
    meta = storage.latest_checkpoint_meta(cfg.run.name)
    if meta is None or meta["step"] < cfg.total_steps() or launch.resume_problem(
            loop, reshardable=reshardable(cfg), source=STREAM):
        return None
    run_id = "off"
    if cfg.mlflow.enabled:
        from mlflow.tracking import MlflowClient

        from vlp.platform.tracking.mlflow_run import check_reachable, run_id_by_key, run_key

        check_reachable(cfg.mlflow.tracking_uri, cfg.mlflow.check_timeout_s)
        client = MlflowClient(cfg.mlflow.tracking_uri)
        exp = client.get_experiment_by_name(cfg.mlflow.experiment)
        found = None if exp is None else run_id_by_key(
            client, [exp.experiment_id], run_key(loop.storage, loop.name))
        run_id = found or "none found"
    return (f"run {cfg.run.name} already finished: step {meta['step']} of "
            f"{cfg.total_steps()}, checkpoint {meta['uri']}, MLflow run {run_id}; nothing to "
            f"train (a new run.name starts a new run)")


def resolved(cfg: ExperimentConfig) -> ExperimentConfig:
    """``pretrain.resolve`` (runs folder, tracking URI) plus the data and weight paths
    resolved against this process's cwd: workers run elsewhere, and the MLflow params then
    name the files actually read."""
    def absolute(path: str) -> str:     # a URI (s3://...) stays as it is
        return str(Path(path).expanduser().resolve()) if path and not is_uri(path) else path

    cfg = resolve(cfg)
    sources = {n: s.model_copy(update=dict(path=absolute(s.path)))
               for n, s in cfg.data.sources.items()}
    data = cfg.data.model_copy(update=dict(
        sources=sources, tokenizer_path=absolute(cfg.data.tokenizer_path or "") or None))
    model = cfg.model.model_copy(update=dict(init_path=absolute(cfg.model.init_path),
                                             cnn_init=absolute(cfg.model.cnn_init)))
    return cfg.model_copy(update=dict(data=data, model=model))


def summary(cfg: ExperimentConfig, setup: PretrainSetup) -> list[str]:
    """What the job will do, derived up front: parameters, steps, global batch in input
    units and (estimated from a few batches read here) in examples."""
    workers, gas = cfg.scaling.num_workers, cfg.train.grad_accum
    micro = workers * gas
    budget = cfg.data.batch_input_units * micro
    per_batch = estimate_examples_per_batch(setup)
    stages = ", ".join(f"{s.name}: {s.steps:,}" for s in cfg.stage_plan())
    lines = [
        f"run {cfg.run.name} → {cfg.run.storage or cfg.run.output_dir}/{cfg.run.name}; MLflow "
        + (f"{cfg.mlflow.tracking_uri} (experiment {cfg.mlflow.experiment})"
           if cfg.mlflow.enabled else "off"),
        f"model {setup.family} (init {cfg.model.init_spec()}): {count_parameters(setup):,} "
        f"parameters; heads {', '.join(setup.tasks)}; D={setup.feature_dim} "
        f"C={setup.num_classes} vocab {setup.vocab_size:,}",
        f"steps: {cfg.total_steps():,} in {len(setup.stages)} stage(s) ({stages}); "
        f"{workers} worker(s) × {gas} micro-batch(es) = {micro} micro-batches per step; "
        f"{cfg.train.precision}, ZeRO-{driver_zero_stage(cfg)}",
        f"global batch: ≤ {budget:,} input units per step ({cfg.data.batch_input_units:,} per "
        f"micro-batch) ≈ {per_batch * micro:,.0f} examples per step (≈ {per_batch:,.1f} per "
        f"micro-batch, estimated from {ESTIMATE_BATCHES} batches; measured at step 1)",
    ]
    lines.append(objective.describe(objective_of(cfg), [st.tasks for st in cfg.stage_plan()]))
    for s, st in zip(setup.stages, cfg.stage_plan()):
        mix = ", ".join(f"{t}:{r:g}" for t, r in st.tasks.items() if r > 0)
        lines.append(f"stage {s.name}: tasks {mix}; {s.plan.summary()}")
    return lines


def driver_zero_stage(cfg: ExperimentConfig) -> int | str:
    """The ZeRO stage as the driver can tell it (``auto`` by size is decided on the workers,
    which know their device's memory; every model here takes ZeRO-1 there)."""
    precision = cfg.train.precision
    if precision == "auto":
        precision = "bf16" if cfg.scaling.use_gpu else "fp32"
    return zero_stage(cfg.train.zero_stage, cfg.scaling.num_workers, precision=precision)


def count_parameters(setup: PretrainSetup) -> int:
    """Built on the meta device: no memory, no weights loaded."""
    import torch

    from vlp.models import create_model

    with torch.device("meta"):
        model = create_model(setup.family, setup.tasks, region_feat_dim=setup.feature_dim or 2048,
                             num_classes=setup.num_classes or 1601,
                             vocab_size=setup.vocab_size).model
    return sum(p.numel() for p in model.parameters())


def estimate_examples_per_batch(setup: PretrainSetup) -> float:
    """Mean examples per micro-batch over a few batches of the first stage, read here with
    the local reader (a small window: a slight underestimate)."""
    from vlp.datasets.stream.local_stream import local_batches

    plan = setup.stages[0].plan
    small = dataclasses.replace(plan, config=plan.config.model_copy(update=dict(bucket_window=512)))
    batches = local_batches(small)
    try:
        sizes = [int(batches.next(plan.tasks[0])["num_examples"]) for _ in range(ESTIMATE_BATCHES)]
    finally:
        batches.close()
    return sum(sizes) / len(sizes)
