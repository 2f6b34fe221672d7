"""Finetune + evaluate a checkpoint on a list of benchmarks; Meta-Sum.

    report = finetune_and_evaluate("runs/pretrain/checkpoint_step00001000",
                                   ["vqa", "retrieval", "nlvr2", "refcoco+"],
                                   world="runs/demo/world", family="uniter-tiny")
    report.meta_sum, report.scores["vqa"], report.benchmarks["nlvr2"].metrics

Each benchmark is one run of the platform's general Ray Train + DeepSpeed loop, configured by
a ``LoopConfig`` built here (``loop_config``) and ``FinetuneComponents``, and one MLflow child
run; evaluation happens on the same workers right after training. The job resolves its
storage and checks every run (set-up, resumable checkpoint) once, before Ray starts.
``checkpoint=None`` finetunes a fresh initialisation ("no pretraining", UNITER Table 3 line 1).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

from vlp.benchmarks import BenchmarkContext, get_benchmark, task_id
from vlp.benchmarks.meta_sum import complete, meta_sum
from vlp.contract.config_loader import flatten, to_yaml
from vlp.platform.cluster import run_storage
from vlp.platform.cluster.job_nodes import scaling_span
from vlp.platform.cluster.ray_session import ensure_ray
from vlp.platform.finetune import tracking
from vlp.platform.finetune.components import FinetuneComponents
from vlp.platform.finetune.finetune_config import FinetuneConfig, load_finetune_config
from vlp.platform.finetune.preflight import Prepared, prepare
from vlp.platform.tracking.choice import TRACKING_ENV, check_tracking_shared
from vlp.platform.tracking.mlflow_run import check_reachable
from vlp.platform.training import launch
from vlp.platform.training.loop_config import (LoopConfig, LoopOptimizer, LoopScaling, LoopStage,
                                               LoopTrain, project)
from vlp.platform.training.jit_ops_dir import extensions_dir
from vlp.platform.training.progress import ProgressPrinter


@dataclass
class BenchmarkReport:
    name: str
    metrics: dict[str, float]
    steps: int
    seconds: float
    run_dir: str
    mlflow_run_id: str | None = None
    predictions: str | None = None
    eval_split: str = ""
    eval_examples: int = 0
    protocol: str = ""           # the head or loss it was finetuned with ("" = only one)
    protocol_source: str = ""    # the family's paper (section), UNITER's, or set
    primary: str = ""            # the benchmark's headline metric (Benchmark.primary)

    @property
    def headline(self) -> float:
        return self.metrics[self.primary]


@dataclass
class DownstreamReport:
    scores: dict[str, float]                 # Meta-Sum parts that were run: vqa, ir, tr, ...
    meta_sum: float | None                   # all five parts run; else None
    benchmarks: dict[str, BenchmarkReport] = field(default_factory=dict)
    parent_run_id: str | None = None
    tracking_uri: str | None = None

    @property
    def protocols(self) -> dict[str, str]:
        """benchmark → the protocol it was finetuned with (benchmarks with a choice)."""
        return {b.name: b.protocol for b in self.benchmarks.values() if b.protocol}

    def lines(self) -> list[str]:
        """One figure per line (``name value``): the Meta-Sum parts, Meta-Sum, the headline of
        each benchmark that is not a part itself (retrieval: r_mean; ve, vcr, ...), then
        every metric, each finetune's protocol after its figures (``retrieval.protocol binary
        (ImageBERT §5.3)``): a score means something only with the head and loss it was
        finetuned with."""
        out = [f"{k} {v:.2f}" for k, v in self.scores.items()]
        if self.meta_sum is not None:
            out.append(f"meta_sum {self.meta_sum:.2f}")
        out += [f"{b.name} {b.headline:.2f}" for b in self.benchmarks.values()
                if b.primary and b.name not in self.scores]
        for b in self.benchmarks.values():
            out += [f"{b.name}.{k} {v:.2f}" for k, v in b.metrics.items()]
            if b.protocol:
                out.append(f"{b.name}.protocol {b.protocol} ({b.protocol_source})")
        return out


def finetune_and_evaluate(checkpoint: str | None, benchmarks: Sequence[str], *, world: str,
                          family: str = "uniter-tiny", run_name: str = "finetune",
                          output_dir: str = "runs", parent_run_id: str | None = None,
                          overrides: Iterable[str] = (), seed: int = 0,
                          num_workers: int = 1, tracking_uri: str = "",
                          mlflow: bool = True, storage: str = "",
                          group: Any = None) -> DownstreamReport:
    """The sweep's entry point: finetune ``checkpoint`` (None = a fresh random init) on each
    of ``benchmarks`` and evaluate it; per-benchmark scores and Meta-Sum. ``overrides`` are
    ``key=value`` strings of :class:`FinetuneConfig` (``settings.vqa.steps=300``);
    ``storage``: the runs' folder or URI ("" = ``output_dir``); ``group``: a kept
    ``worker_group.WorkerGroup`` to run the finetunes on (None: a Ray Train run each)."""
    data = {"run": {"name": run_name, "output_dir": output_dir, "storage": storage or output_dir,
                    "seed": seed},
            "model": {"family": family, "init": "checkpoint" if checkpoint else "random",
                      "checkpoint": checkpoint or ""},
            "world": world, "benchmarks": list(benchmarks),
            "scaling": {"num_workers": num_workers},
            "mlflow": {"enabled": mlflow, "tracking_uri": tracking_uri,
                       "parent_run_id": parent_run_id or ""}}
    return run_finetune(load_finetune_config(data=data, overrides=overrides), group=group)


def run_finetune(cfg: FinetuneConfig, *, before_ray: Callable[[], None] | None = None,
                 group: Any = None) -> DownstreamReport:
    """``before_ray``: called once every check has passed, just before Ray starts (the
    command names its Ray log file there)."""
    cfg = with_tracking_env(cfg.resolved_paths())
    prepared = prepare(cfg)                        # bad inputs fail here, before Ray starts
    storage = run_storage.resolve(cfg.run.storage, cfg.run.output_dir)
    for name in cfg.benchmarks:   # every run's set-up is checked before the first starts
        steps, batch_size, lr, options = cfg.settings_for(name)
        get_benchmark(name).check(components_for(cfg, name, prepared, batch_size, options).ctx)
        problem = launch.resume_problem(loop_config(cfg, name, steps, lr, storage.root))
        if problem:
            raise ValueError(problem)
    if cfg.mlflow.enabled and cfg.mlflow.tracking_uri:
        check_reachable(cfg.mlflow.tracking_uri, cfg.mlflow.check_timeout_s)
    # every check has passed: only now is anything written (a bad input leaves no folder)
    storage.create_root()
    parent = None
    if cfg.mlflow.enabled:
        parent = tracking.resolve_parent(
            tracking_uri=cfg.mlflow.tracking_uri, experiment=cfg.mlflow.experiment,
            run_name=cfg.run.name, output_dir=cfg.run.output_dir,
            parent_run_id=cfg.mlflow.parent_run_id,
            checkpoint=cfg.model.checkpoint if cfg.model.init == "checkpoint" else "")
    if before_ray is not None:
        before_ray()
    ensure_ray(cfg.scaling.num_workers * cfg.scaling.cpus_per_worker)
    span = scaling_span(cfg.scaling)       # after Ray is attached: the nodes the job spans
    run_storage.check_shared(storage, nodes=span.nodes, why=span.why)
    if parent is not None:
        check_tracking_shared(parent.tracking_uri, nodes=span.nodes, why=span.why)
    reports = {}
    for name in cfg.benchmarks:
        reports[name] = finetune_one(cfg, name, prepared, parent, storage.root, group)
    scores = meta_parts(reports)
    total = meta_sum(scores) if complete(scores) else None
    if parent is not None:
        tracking.log_summary(parent, scores, total,
                             {n: r.protocol for n, r in reports.items() if r.protocol})
    return DownstreamReport(scores, total, reports, parent.run_id if parent else None,
                            parent.tracking_uri if parent else None)


def with_tracking_env(cfg: FinetuneConfig) -> FinetuneConfig:
    """``mlflow.tracking_uri``, else ``$MLFLOW_TRACKING_URI`` (``tracking_choice``); still ""
    means the pretraining run's store if found, else the embedded one."""
    uri = cfg.mlflow.tracking_uri or os.environ.get(TRACKING_ENV, "")
    return cfg.model_copy(update=dict(mlflow=cfg.mlflow.model_copy(update=dict(tracking_uri=uri))))


def finetune_one(cfg: FinetuneConfig, name: str, prepared: Prepared,
                 parent: tracking.Parent | None, storage: str,
                 group: Any = None) -> BenchmarkReport:
    """One benchmark's loop, its config resolved and checked by ``run_finetune``; on
    ``group`` when given (a kept worker group), else a Ray Train run of its own."""
    steps, batch_size, lr, options = cfg.settings_for(name)
    components = components_for(cfg, name, prepared, batch_size, options)
    loop = loop_config(cfg, name, steps, lr, storage)
    start = time.perf_counter()
    result = launch.run_loop(loop, components, tracking_spec(cfg, loop, parent),
                             callbacks=[ProgressPrinter(steps, [name], job="finetune")],
                             group=group)
    after = result.return_value.get("after_training") or {}
    if not after:
        raise RuntimeError(f"finetune {name}: training stopped at step {result.final_step} of "
                           f"{steps}; no evaluation ran")
    protocol, source = cfg.protocol_of(name)
    report = BenchmarkReport(name, dict(after["metrics"]), steps, time.perf_counter() - start,
                             result.run_dir, result.mlflow_run_id, after.get("predictions"),
                             after.get("eval_split", ""), after.get("eval_examples", 0),
                             protocol, source, after.get("primary", ""))
    if parent is not None and result.mlflow_run_id:
        params = {f"finetune.{k}": v for k, v in flatten({
            "benchmark": name, "init": cfg.model.init, "checkpoint": cfg.model.checkpoint,
            "checkpoint_step": prepared.checkpoint_step, "batch_size": batch_size,
            "eval_split": cfg.eval.split, "options": options.model_dump(),
            "protocol": protocol, "protocol_source": source,
            **soho_params(cfg, prepared)}).items()}
        tracking.log_benchmark(parent.tracking_uri, result.mlflow_run_id, params,
                               report.metrics, report.predictions)
    return report


def soho_params(cfg: FinetuneConfig, prepared: Prepared) -> dict[str, Any]:
    """SOHO's finetuning visual input and dictionary switch (other families have neither)."""
    if prepared.family.visual.kind != "soho":
        return {}
    return {"visual_tokens": cfg.model.visual_tokens,
            "dictionary_updates": cfg.model.dictionary_updates}


def components_for(cfg: FinetuneConfig, name: str, prepared: Prepared, batch_size: int,
                   options: Any, zero_shot: bool = False) -> FinetuneComponents:
    ctx = BenchmarkContext(prepared.data, options, prepared.family, cfg.eval.split, cfg.run.seed)
    return FinetuneComponents(
        benchmark=name, ctx=ctx, init=cfg.model.init, checkpoint=cfg.model.checkpoint,
        batch_size=batch_size, eval_batch_size=cfg.eval.batch_size, dropout=cfg.train.dropout,
        predictions_dir=predictions_folder(cfg, run_name(cfg, name)), zero_shot=zero_shot,
        visual_tokens=cfg.model.visual_tokens, dictionary_updates=cfg.model.dictionary_updates)


def predictions_folder(cfg: FinetuneConfig, run: str) -> str:
    """Where rank 0 writes a run's predictions: in the run's storage (a URI on a cluster),
    never a folder local to whichever node rank 0 lands on."""
    return run_storage.resolve(cfg.run.storage, cfg.run.output_dir).uri(run, "predictions")


def loop_config(cfg: FinetuneConfig, name: str, steps: int, lr: float,
                storage: str) -> LoopConfig:
    """The general loop's config for one finetune: one stage of the benchmark's task, a
    checkpoint at the end only; the warm-up a fraction of the steps."""
    t = cfg.train
    return LoopConfig(
        name=run_name(cfg, name), storage=storage, seed=cfg.run.seed,
        max_failures=cfg.run.max_failures,
        stages=(LoopStage("finetune", steps, {get_benchmark(name).task: 1.0}),),
        checkpoint_interval=steps, checkpoint_keep=1, family=cfg.model.family, job="finetune",
        train=LoopTrain(precision=t.precision, zero_stage=t.zero_stage,
                        log_every=min(t.log_every, steps),
                        extensions_dir=extensions_dir(t.extensions_dir)),
        optimizer=LoopOptimizer(lr=lr, betas=tuple(t.betas), weight_decay=t.weight_decay,
                                grad_clip=t.grad_clip,
                                warmup_steps=min(int(t.warmup_fraction * steps), steps - 1)),
        scaling=project(LoopScaling, cfg.scaling))


def tracking_spec(cfg: FinetuneConfig, loop: LoopConfig,
                  parent: tracking.Parent | None) -> dict[str, Any]:
    """A child run of ``parent`` (none without one); its params are the loop's config (the
    benchmark's own settings follow as ``finetune.*`` once it is done)."""
    return launch.tracking_spec(
        loop, enabled=parent is not None, tracking_uri=parent.tracking_uri if parent else "",
        experiment=parent.experiment if parent else cfg.mlflow.experiment,
        output_dir=cfg.run.output_dir, params=flatten(loop), config_text=to_yaml(loop),
        job="finetune", parent_run_id=parent.run_id if parent else None)


def run_name(cfg: FinetuneConfig, benchmark: str) -> str:
    """``<name>-<benchmark>`` as a folder name ('+' is not one: refcoco+ → refcocoplus)."""
    return f"{cfg.run.name}-{task_id(benchmark)}"


def meta_parts(reports: dict[str, BenchmarkReport]) -> dict[str, float]:
    """Meta-Sum part → score, from each benchmark's declared ``meta_parts``."""
    out = {}
    for name, r in reports.items():
        for part, key in get_benchmark(name).meta_parts.items():
            out[part] = r.metrics[key]
    return out
