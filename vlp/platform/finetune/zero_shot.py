"""Zero-shot evaluation (UNITER Table 4 "ZS", ImageBERT Table 1): retrieval scored straight
from the pretrained ITM head, no finetuning — on the same Ray Train workers and the same
sharded evaluation as a finetune, through an evaluation-only worker function (no optimizer,
no checkpoint)."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from vlp.platform.cluster import run_storage
from vlp.platform.cluster.job_nodes import scaling_span
from vlp.platform.finetune import tracking
from vlp.platform.finetune.finetune_config import FinetuneConfig
from vlp.platform.finetune.preflight import prepare
from vlp.platform.cluster.ray_session import ensure_ray
from vlp.platform.finetune.run import (BenchmarkReport, components_for, predictions_folder,
                                       run_name)
from vlp.platform.training import launch
from vlp.platform.training.failures import setup_phase
from vlp.platform.training.loop_config import LoopScaling, project
from vlp.platform.training.protocols import WorkerInfo

ZERO_SHOT_BENCHMARKS = ("retrieval",)


def eval_loop_per_worker(config: dict[str, Any]) -> dict | None:
    import ray.train
    import ray.train.torch
    import torch

    components = config["components"]
    ctx = ray.train.get_context()
    # the model and its checkpoint: an error here fails every attempt alike (not retried)
    with setup_phase(f"rank {ctx.get_world_rank()} set-up"):
        device = ray.train.torch.get_device() if config["use_gpu"] else torch.device("cpu")
        torch.manual_seed(config["seed"])
        model = components.build_model(None, []).to(device)
    info = WorkerInfo(ctx.get_world_rank(), ctx.get_world_size(), ctx.get_local_rank(),
                      device, config["seed"])
    return components.after_training(None, model, info)


def evaluate_zero_shot(cfg: FinetuneConfig) -> dict[str, BenchmarkReport]:
    """Zero-shot scores of ``cfg.model.checkpoint`` on ``cfg.benchmarks`` (retrieval)."""
    import ray.train

    from vlp.platform.finetune.run import with_tracking_env
    from vlp.platform.tracking.choice import check_tracking_shared
    from vlp.platform.tracking.mlflow_run import check_reachable

    cfg = with_tracking_env(cfg.resolved_paths())
    bad = [b for b in cfg.benchmarks if b not in ZERO_SHOT_BENCHMARKS]
    if bad:
        raise ValueError(f"zero-shot evaluation exists for {list(ZERO_SHOT_BENCHMARKS)} (scored "
                         f"by the pretrained ITM head), not {bad}")
    if cfg.model.init != "checkpoint":
        raise ValueError("zero-shot evaluation needs a pretrained checkpoint (--checkpoint)")
    prepared = prepare(cfg)
    storage = run_storage.resolve(cfg.run.storage, cfg.run.output_dir)
    if cfg.mlflow.enabled and cfg.mlflow.tracking_uri:
        check_reachable(cfg.mlflow.tracking_uri, cfg.mlflow.check_timeout_s)
    storage.create_root()             # every check has passed: a bad input writes nothing
    ensure_ray(cfg.scaling.num_workers * cfg.scaling.cpus_per_worker)
    span = scaling_span(cfg.scaling)       # after Ray is attached: the nodes the job spans
    run_storage.check_shared(storage, nodes=span.nodes, why=span.why)
    parent = None
    if cfg.mlflow.enabled:
        parent = tracking.resolve_parent(
            tracking_uri=cfg.mlflow.tracking_uri, experiment=cfg.mlflow.experiment,
            run_name=cfg.run.name, output_dir=cfg.run.output_dir,
            parent_run_id=cfg.mlflow.parent_run_id, checkpoint=cfg.model.checkpoint)
        check_tracking_shared(parent.tracking_uri, nodes=span.nodes, why=span.why)
    out = {}
    for name in cfg.benchmarks:
        _, batch_size, _, options = cfg.settings_for(name)
        run = run_name(cfg, "zero-shot-" + name)
        components = dataclasses.replace(
            components_for(cfg, name, prepared, batch_size, options, zero_shot=True),
            predictions_dir=predictions_folder(cfg, run))
        start = time.perf_counter()
        # the launch path of every job: a set-up error in a worker fails once
        result = launch.fit_once(dict(
            train_loop_per_worker=eval_loop_per_worker,
            train_loop_config={"components": components, "use_gpu": cfg.scaling.use_gpu,
                               "seed": cfg.run.seed},
            scaling_config=launch.scaling_config(project(LoopScaling, cfg.scaling)),
            run_config=ray.train.RunConfig(
                name=run, **storage.ray_storage(),
                failure_config=ray.train.FailureConfig(max_failures=cfg.run.max_failures))),
            storage.uri(run))
        value = result.return_value or {}
        report = BenchmarkReport(f"{name}-zero-shot", dict(value["metrics"]), 0,
                                 time.perf_counter() - start, storage.uri(run),
                                 predictions=value.get("predictions"),
                                 eval_split=value.get("eval_split", ""),
                                 eval_examples=value.get("eval_examples", 0))
        if parent is not None:
            from vlp.platform.tracking.mlflow_run import MlflowRun

            child = MlflowRun.open(parent.tracking_uri, parent.experiment, run_name=run,
                                   parent_run_id=parent.run_id)
            tracking.log_benchmark(parent.tracking_uri, child.run_id, {
                "zero_shot.benchmark": name, "zero_shot.checkpoint": cfg.model.checkpoint,
                "zero_shot.eval_split": cfg.eval.split}, report.metrics, report.predictions)
            child.finish("FINISHED")
            report.mlflow_run_id = child.run_id
        out[name] = report
    if parent is not None and parent.owned:
        tracking.log_summary(parent, {}, None)
    return out
