"""Run (or resume) a sweep: Ray Tune over the trial function, OptunaSearch (TPE, seeded) with
ASHA for a search, a grid over the named lines for a replay.

    cfg = load_sweep_config("jobs/configs/sweep-demo.yaml")
    result = run_sweep(cfg)              # checks everything first, then runs the trials
    print(result.leaderboard.markdown())

Re-running the same sweep (same ``sweep.name`` and storage: ``sweep.storage``, else
$VLP_STORAGE, else ``sweep.output_dir``) continues it with ``Tuner.restore(...,
resume_errored=True)``: finished trials are kept, interrupted ones resume from their last
finished stage, Optuna goes on from its saved study and ASHA from its saved rungs
(``asha.py``, in the storage). A finished sweep re-run just prints its leaderboard again.
The sweep's folder may be a URI (``s3://bucket/vlp``): Tune's state, the trials' folders and
their runs are all read and written through ``run_storage``, so a sweep driver resubmitted
with ``ray job submit`` (a new working folder) restores it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import yaml

from vlp.contract.config_loader import ConfigError, flatten, to_dict
from vlp.platform.tracking.leaderboard import Leaderboard, load_leaderboard
from vlp.platform.tracking.leaderboard_export import log_leaderboard
from vlp.platform.cluster.ray_session import ensure_ray
from vlp.platform.sweep.asha import STATE_FILE as ASHA_STATE_FILE
from vlp.platform.sweep.callbacks import SweepProgress
from vlp.platform.sweep.sweep_config import SweepConfig
from vlp.platform.sweep.preflight import SweepPlan, check_sweep
from vlp.platform.sweep.point import TrialPoint
from vlp.platform.sweep.space import SpaceSampler
from vlp.platform.cluster.job_nodes import job_span, worker_resources
from vlp.platform.cluster.run_storage import RunStorage, check_shared
from vlp.platform.sweep.trial_configs import resolve_text_init
from vlp.platform.tracking.choice import check_tracking_shared
from vlp.platform.sweep.tracking import open_parent_run
from vlp.platform.sweep.trial import TrialContext, run_trial

CONFIG_FILE = "sweep.yaml"
INSTANCE_FILE = "instance"
TUNE_DIR = "tune"
EXHAUSTED_FILE = "space_exhausted"   # the search ran out of new points (distinct_search.py)
METRIC, TIME_ATTR = "score", "stage"
# may change between a sweep and its resumption; everything else must match (output_dir is
# local scratch once the storage is elsewhere: a resubmitted job resolves it in a new folder)
RESUMABLE_CHANGES = ("sweep.max_concurrent", "sweep.trial_retries", "sweep.output_dir")


@dataclass
class SweepResult:
    leaderboard: Leaderboard
    sweep_dir: str
    trials_dir: str            # one folder per trial: its Ray Train runs, attempts.jsonl
    tracking_uri: str
    parent_run_id: str
    trials: int
    errors: int
    interrupted: bool          # stopped early (Ctrl-C / SIGUSR1): run again to resume
    seconds: float


def _print(text: str) -> None:
    print(text, flush=True)      # job logs and redirected output are pipes: no buffering


def run_sweep(cfg: SweepConfig, *, say: Callable[[str], None] = _print,
              callbacks: Sequence[Any] = ()) -> SweepResult:
    """``callbacks``: extra ``ray.tune.Callback``s (kept with the experiment state)."""
    import ray.tune

    start = time.perf_counter()
    cfg = cfg.resolved()
    plan = check_sweep(cfg)                    # every bad input fails here, before Ray
    sweep_dir = cfg.sweep_dir                  # local: Ray's log
    storage = cfg.sweep_storage()              # Tune's state, the trials' folders
    resuming, instance = _check_resume(cfg, storage)
    # after the resume check: the saved config keeps "auto", trials get the weights' path
    cfg = resolve_text_init(cfg, [p for _, p in plan.lines + plan.first] or
                            ([TrialPoint(init="text")] if "text" in cfg.space.init else []),
                            say=lambda line: say(f"[sweep] {line}"))
    trials_dir = storage.uri(f"trials-{instance}")
    per_trial = trial_cpus(cfg)
    ensure_ray(per_trial * max(1, cfg.sweep.max_concurrent), dashboard=True)
    # trials spanning nodes: the sweep folder and the MLflow store must reach every node
    workers, cpus, use_gpu = _pretrain_scaling(cfg)
    span = job_span(int(max(workers, cfg.finetune.num_workers)),
                    worker_resources(cpus, use_gpu or cfg.finetune.use_gpu))
    check_shared(storage, nodes=span.nodes, why=span.why)
    check_tracking_shared(cfg.mlflow.tracking_uri, nodes=span.nodes, why=span.why)
    concurrency = cfg.sweep.max_concurrent or auto_concurrency(per_trial, trial_gpus(cfg))
    from vlp.platform.cluster.console import RAY_LOG, log_to

    ray_log = log_to(sweep_dir / RAY_LOG)      # None: not routed (verbose, or a library call)
    parent = open_parent_run(cfg, instance)
    lines = {name: point.to_params() for name, point in plan.lines}
    total = len(lines) or cfg.sweep.num_samples
    for line in _summary(cfg, plan, per_trial, concurrency, parent.run_id):
        say(f"[sweep] {line}")
    if ray_log is not None:
        say(f"[sweep] Ray's own output (Train/Tune logs, workers' prints) → {ray_log} "
            f"(--verbose prints it here)")
    ctx = TrialContext(cfg, parent.run_id, instance, trials_dir, lines,
                       include_seeds={p.key(): cfg.sweep.include_seeds[n]
                                      for n, p in plan.first if n in cfg.sweep.include_seeds})
    trainable = ray.tune.with_resources(ray.tune.with_parameters(run_trial, ctx=ctx),
                                        {"CPU": 0.01})   # it waits; its Train workers hold CPUs
    tune_path, tune_fs = tune_location(storage)
    if not resuming and storage.exists(ASHA_STATE_FILE):
        storage.delete(ASHA_STATE_FILE)   # saved rungs belong to the Tune state beside them
    if resuming:
        say(f"[sweep] resuming the sweep in {storage.root} (finished trials are kept)")
        tuner = ray.tune.Tuner.restore(tune_path, trainable=trainable, resume_errored=True,
                                       storage_filesystem=tune_fs)
    else:
        tuner = ray.tune.Tuner(
            trainable, param_space=_param_space(plan),
            tune_config=_tune_config(cfg, plan, concurrency),
            run_config=ray.tune.RunConfig(
                name=TUNE_DIR, **storage.ray_storage(), verbose=0,
                failure_config=ray.tune.FailureConfig(max_failures=cfg.sweep.trial_retries,
                                                      fail_fast=False),
                checkpoint_config=ray.tune.CheckpointConfig(num_to_keep=2),
                callbacks=[SweepProgress(cfg.mlflow.tracking_uri, parent.run_id, total, lines),
                           *callbacks]))
    grid = tuner.fit()
    statuses = [r.metrics.get("stage") for r in grid]
    errors = sum(r.error is not None for r in grid)
    from vlp.platform.sweep.distinct_search import space_exhausted

    exhausted = space_exhausted(storage.uri(EXHAUSTED_FILE))
    if exhausted:
        say(f"[sweep] the search ran out of new points ({exhausted}): it ends early")
    interrupted = _interrupted(storage, total, bool(exhausted))
    board = load_leaderboard(cfg.mlflow.tracking_uri, parent.run_id)
    log_leaderboard(cfg.mlflow.tracking_uri, board)
    parent.log_metrics({"trials": len(statuses), "trial_errors": errors,
                        "sweep_seconds": time.perf_counter() - start}, step=0)
    parent.set_tags({"vlp.state": "interrupted" if interrupted else "completed"})
    parent.finish("KILLED" if interrupted else "FINISHED")
    return SweepResult(board, storage.root, trials_dir, cfg.mlflow.tracking_uri,
                       parent.run_id, len(statuses), errors, interrupted,
                       time.perf_counter() - start)


# ---- Tune set-up ----------------------------------------------------------------------------

def _param_space(plan: SweepPlan) -> dict[str, Any]:
    import ray.tune

    if plan.lines:   # a replay: one grid point per named line
        return {"line": ray.tune.grid_search([name for name, _ in plan.lines])}
    return {}


def _tune_config(cfg: SweepConfig, plan: SweepPlan, concurrency: int) -> Any:
    import ray.tune
    from ray.tune.schedulers import FIFOScheduler

    from vlp.platform.sweep.asha import PersistentASHA

    stages = len(cfg.finetune.benchmarks)
    # a trial's next one takes over its ended actor (every trial asks the same 0.01 CPU):
    # no new process importing Tune, Train and vlp (~7 CPU s) per trial. Tune reuses an actor
    # only once its trial's function has returned (else it starts another), and a trial
    # keeps no state of its own outside its function: its worker group is closed, its runs
    # are named by id
    names = dict(trial_name_creator=tune_trial_name, trial_dirname_creator=tune_trial_dirname,
                 reuse_actors=True)
    if plan.lines:
        return ray.tune.TuneConfig(metric=METRIC, mode="max", num_samples=1,
                                   scheduler=FIFOScheduler(),
                                   max_concurrent_trials=concurrency, **names)
    import optuna

    from vlp.platform.sweep.distinct_search import DistinctPointSearch

    sampler = optuna.samplers.TPESampler(seed=cfg.sweep.seed,
                                         n_startup_trials=cfg.sweep.tpe_startup)
    # a point is one line: a repeat proposal is turned away, not run as a trial
    search = DistinctPointSearch(
        space=SpaceSampler(cfg.space), metric=METRIC, mode="max", sampler=sampler,
        points_to_evaluate=[cfg.space.params_for(p) for _, p in plan.first],
        exhausted_marker=cfg.sweep_storage().uri(EXHAUSTED_FILE))
    scheduler = FIFOScheduler()
    if cfg.sweep.scheduler == "asha" and stages > cfg.sweep.grace_period:
        # rungs at grace_period · rf^k finetune stages; stage 0 (pretraining) is never a rung
        scheduler = PersistentASHA(cfg.sweep_storage(), time_attr=TIME_ATTR,
                                   max_t=stages, grace_period=cfg.sweep.grace_period,
                                   reduction_factor=cfg.sweep.reduction_factor)
    return ray.tune.TuneConfig(metric=METRIC, mode="max", search_alg=search,
                               scheduler=scheduler, num_samples=cfg.sweep.num_samples,
                               max_concurrent_trials=concurrency, **names)


def tune_trial_name(trial: Any) -> str:
    """Tune's name of a trial: ours (L10, t003), not the config spelled out."""
    from vlp.platform.sweep.callbacks import trial_name

    try:
        return trial_name(trial.config)
    except (KeyError, ValueError, TypeError):
        return str(trial.trial_id)


def tune_trial_dirname(trial: Any) -> str:
    return f"{tune_trial_name(trial)}_{trial.trial_id}"


def tune_location(storage: RunStorage) -> tuple[str, Any]:
    """(path, filesystem) of the sweep's Tune experiment for ``Tuner.restore`` /
    ``can_restore`` / ``ExperimentAnalysis``: a local path as it is; in a URI's storage the
    path inside our filesystem (its endpoint from the environment, which Ray's own URI
    resolution does not read)."""
    if storage.is_local:
        return storage.uri(TUNE_DIR), None
    return storage.fs_path(TUNE_DIR), storage.fs


def _interrupted(storage: RunStorage, expected: int, exhausted: bool = False) -> bool:
    """Whether the sweep stopped short (Tune returns normally after SIGINT/SIGUSR1): a trial
    left unfinished, or fewer trials than planned (Tune creates them as slots free up) unless
    the search ran out of new points."""
    from ray.tune import ExperimentAnalysis

    path, fs = tune_location(storage)
    try:
        trials = ExperimentAnalysis(path, storage_filesystem=fs).trials
    except Exception:
        return False
    return ((len(trials) < expected and not exhausted)
            or any(t.status not in ("TERMINATED", "ERROR") for t in trials))


# ---- resources ------------------------------------------------------------------------------

def _pretrain_scaling(cfg: SweepConfig):
    """The trials' pretraining ``scaling`` section, defaults filled in."""
    from vlp.platform.pretrain.experiment_config import ScalingSection

    given = cfg.pretrain.get("scaling", {}) if isinstance(cfg.pretrain, dict) else {}
    default = ScalingSection()
    return (float(given.get("num_workers", default.num_workers)),
            float(given.get("cpus_per_worker", default.cpus_per_worker)),
            bool(given.get("use_gpu", default.use_gpu)))


def trial_cpus(cfg: SweepConfig) -> float:
    """CPUs one trial holds at its peak: its largest Train run (pretraining or finetuning
    workers) plus one for Ray Data's read tasks and the Train controller. Tune does not count
    the Train workers a trial starts, so concurrency is derived from this."""
    workers, cpus, _ = _pretrain_scaling(cfg)
    ft = cfg.finetune.num_workers * cfg.finetune.cpus_per_worker
    return max(workers * cpus, ft) + 1.0


def trial_gpus(cfg: SweepConfig) -> float:
    """GPUs one trial holds at its peak (one per worker of a GPU run)."""
    workers, _, use_gpu = _pretrain_scaling(cfg)
    ft = float(cfg.finetune.num_workers) if cfg.finetune.use_gpu else 0.0
    return max(workers if use_gpu else 0.0, ft)


def auto_concurrency(per_trial_cpus: float, per_trial_gpus: float = 0.0) -> int:
    """Trials at once from the cluster's resources (Tune does not count the Train workers a
    trial starts). An autoscaling cluster reports what it has now: set
    sweep.max_concurrent there."""
    import ray

    have = ray.cluster_resources()
    n = int(float(have.get("CPU", 1.0)) // per_trial_cpus)
    if per_trial_gpus:
        n = min(n, int(float(have.get("GPU", 0.0)) // per_trial_gpus))
    return max(1, n)


# ---- the sweep folder ------------------------------------------------------------------------

def _check_resume(cfg: SweepConfig, storage: RunStorage) -> tuple[bool, str]:
    """(resuming, instance). Resuming when the sweep's folder holds this sweep's Tune state
    (then the configs must agree). A fresh start writes the config and a new instance id:
    MLflow runs and trial folders are keyed by it, so a folder emptied and reused for a new
    sweep never re-attaches to the old sweep's runs."""
    import uuid

    import ray.tune

    where = storage.root
    tune_path, tune_fs = tune_location(storage)
    if (not ray.tune.Tuner.can_restore(tune_path, storage_filesystem=tune_fs)
            or not storage.exists(INSTANCE_FILE)):
        if storage.exists(TUNE_DIR):
            raise ConfigError([("sweep.name", f"{where} holds an unfinished sweep that "
                                              f"cannot be resumed (no Tune state or no "
                                              f"{INSTANCE_FILE}): use another sweep.name or "
                                              f"remove the folder")])
        storage.create_root()
        instance = uuid.uuid4().hex[:8]
        storage.write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False), CONFIG_FILE)
        storage.write_text(instance + "\n", INSTANCE_FILE)
        return False, instance
    if storage.exists(CONFIG_FILE):
        from vlp.platform.sweep.sweep_config import load_sweep_config

        saved = load_sweep_config(data=yaml.safe_load(storage.read_text(CONFIG_FILE)))
        if not saved.sweep.storage:     # saved before sweep.storage: its output_dir held it
            saved = saved.model_copy(update=dict(sweep=saved.sweep.model_copy(
                update=dict(storage=saved.sweep.output_dir))))
        before = flatten(saved)
        now = flatten(cfg)
        changed = sorted(k for k in set(before) | set(now)
                         if before.get(k) != now.get(k) and k not in RESUMABLE_CHANGES)
        if changed:
            raise ConfigError([(k, f"differs from the sweep already in {where} "
                                   f"({before.get(k)!r} there): to resume it keep its config; "
                                   f"for a new sweep use another sweep.name") for k in changed])
    return True, storage.read_text(INSTANCE_FILE).strip()


def _summary(cfg: SweepConfig, plan: SweepPlan, per_trial: float, concurrency: int,
             parent_run_id: str) -> list[str]:
    import ray

    stages = ", ".join(cfg.finetune.benchmarks)
    lines = [f"{cfg.sweep.name} ({cfg.mode}) → {cfg.sweep_uri}; MLflow "
             f"{cfg.mlflow.tracking_uri} experiment {cfg.mlflow.experiment}, parent run "
             f"{parent_run_id}",
             f"model {cfg.model.family}; world {cfg.world}; stages: pretrain, then finetune "
             f"{stages}",
             f"{int(ray.cluster_resources().get('CPU', 0))} CPUs in the cluster, {per_trial:g} "
             f"per trial → {concurrency} trial(s) at a time"]
    sw = cfg.sweep
    named = {} if plan.lines else sw.include_seeds
    if sw.seeds > 1 or any(k > 1 for k in named.values()):
        which = f"{sw.seeds} per point" + "".join(f", {k} for {n}" for n, k in named.items())
        lines.append(f"replicates: {which} (training seeds from {sw.seed}; the world stays "
                     f"fixed); the search and ASHA see each point's mean")
    else:
        lines.append("one seed per point: the leaderboard has no noise estimate (set "
                     "sweep.seeds, or sweep.include_seeds: {none: 3} for a pooled one)")
    if plan.lines:
        lines.append(f"grid: {len(plan.lines)} lines: "
                     + "; ".join(f"{n} {p.mix_label()}" for n, p in plan.lines))
    else:
        s = cfg.space
        sched = (f"ASHA (time_attr {TIME_ATTR}, grace {cfg.sweep.grace_period}, "
                 f"rf {cfg.sweep.reduction_factor})" if cfg.sweep.scheduler == "asha"
                 else "FIFO")
        lines.append(f"search: {cfg.sweep.num_samples} trials, Optuna TPE (seed "
                     f"{cfg.sweep.seed}, {cfg.sweep.tpe_startup} random first) + {sched} on "
                     f"'{METRIC}'; tasks {s.tasks} ratios {[float(r) for r in s.ratios]} "
                     f"masking {s.masking} data {s.data} init {s.init}"
                     + ("" if s.no_pretraining else "; at least one task"))
        if plan.first:
            lines.append("evaluated first: " + "; ".join(f"{n} = {p.describe()}"
                                                         for n, p in plan.first))
    return lines


__all__ = ["run_sweep", "SweepResult", "trial_cpus", "trial_gpus", "ensure_ray",
           "auto_concurrency"]
