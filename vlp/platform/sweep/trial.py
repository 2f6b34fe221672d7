"""One sweep trial, a Ray Tune function trainable: pretrain the point's config (unless it is
the no-pretraining point), then finetune and evaluate on each benchmark in turn, reporting
to Tune after every stage.

    stage 0            pretraining (vlp.platform.pretrain_job.pretrain)      score 0
    stage k = 1..B     finetune + evaluate benchmark k (finetune_and_evaluate)  score = the
                       Meta-Sum parts so far (sum of the scores of benchmarks 1..k)

``stage`` is ASHA's ``time_attr``: every trial finetunes the benchmarks in the same order, so
scores at the same stage compare. Each report carries a small Tune checkpoint (what is done,
the pretraining checkpoint path, the scores): a trial resumed by ``Tuner.restore`` skips its
finished stages, and its Ray Train runs have deterministic names, so an interrupted
pretraining resumes from its own last checkpoint.

MLflow: the trial's run is a child of the sweep's parent run; the pretraining run and each
finetune run nest under the trial's run.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from vlp.platform.evaluation.metrics import META_SUM_PARTS, meta_sum
from vlp.platform.sweep.config import SweepConfig
from vlp.platform.sweep.point import TrialPoint

STATE_FILE = "sweep_trial.json"
ATTEMPTS_FILE = "attempts.jsonl"     # one line per start of the trial function (resume audit)
TRIAL_TAG = "vlp.sweep.trial"
JOB_TAG_VALUE = "sweep-trial"


def metric_key(part: str) -> str:
    """Meta-Sum part → a key MLflow accepts ('+' is not allowed in metric names)."""
    return part.replace("+", "_plus")


@dataclass
class TrialContext:
    """What every trial needs besides its point; small and picklable (``tune.with_parameters``)."""
    cfg: SweepConfig                  # resolved (absolute paths, tracking URI)
    parent_run_id: str
    instance: str                     # this sweep's id (see run._check_resume)
    trials_dir: str                   # <sweep_dir>/trials-<instance>: one folder per trial
    lines: dict[str, dict[str, Any]] = field(default_factory=dict)   # replay: line → point params


@dataclass
class TrialState:
    done: int = -1                    # last finished stage (-1: none)
    checkpoint: str | None = None     # the pretraining checkpoint (None: no pretraining)
    scores: dict[str, float] = field(default_factory=dict)   # Meta-Sum parts so far
    steps: int = 0                    # optimizer steps spent: pretraining + finetunes
    seconds: float = 0.0              # wall time of the finished stages
    pretrain_loss: float | None = None
    mlflow_run_id: str | None = None


def trial_identity(config: dict[str, Any], ctx: TrialContext) -> tuple[str, TrialPoint]:
    """(trial name, point): replay trials are named by their line (L01...), search trials by
    Optuna's trial number (t001...). Both survive ``Tuner.restore``: run folders and MLflow
    runs are found again by name."""
    if "line" in config:
        return config["line"], TrialPoint.from_params(ctx.lines[config["line"]])
    return f"t{int(config['trial_number']) + 1:03d}", TrialPoint.from_params(config["point"])


def run_trial(config: dict[str, Any], ctx: TrialContext) -> None:
    """The Tune trainable (wrapped with ``tune.with_parameters(run_trial, ctx=...)``)."""
    import ray.tune

    name, point = trial_identity(config, ctx)
    cfg = ctx.cfg
    trial_dir = str(Path(ctx.trials_dir) / name)
    Path(trial_dir).mkdir(parents=True, exist_ok=True)
    state = _load_state(ray.tune.get_checkpoint())
    _log_attempt(trial_dir, state)
    benchmarks = list(cfg.finetune.benchmarks)
    total = len(benchmarks)
    run = _open_run(ctx, name, point, fresh=state.done < 0)
    state.mlflow_run_id = run.run_id
    say = lambda text: print(f"[sweep] {name} {text}", flush=True)  # noqa: E731
    if state.done >= total:     # interrupted between its last stage and Tune noting it
        _finish(run, state, benchmarks)
        return
    if state.done >= 0:
        say(f"resumes after stage {state.done}/{total} ({point.describe()})")
    elif not ctx.lines:
        twin = _finished_twin(ctx, point, run.run_id)
        if twin is not None:
            say(f"same point as {twin[0]} (finished): its results are reused, no compute")
            _replay_twin(run, state, twin, benchmarks)
            return
    try:
        if state.done < 0:
            t0 = time.perf_counter()
            if point.pretrains:
                say(f"stage 0/{total}: pretraining {point.describe()}")
                _pretrain(ctx, point, name, trial_dir, run.run_id, state)
            else:
                say(f"stage 0/{total}: no pretraining ({point.describe()}); finetunes start "
                    f"from the init")
            state.seconds += time.perf_counter() - t0
            state.done = 0
            _report(state, 0, total, benchmarks, extra={"pretrain_seconds": state.seconds})
        for k in range(state.done + 1, total + 1):
            bench = benchmarks[k - 1]
            say(f"stage {k}/{total}: finetune + evaluate {bench}")
            t0 = time.perf_counter()
            _finetune(ctx, point, name, trial_dir, run.run_id, bench, state)
            state.seconds += time.perf_counter() - t0
            state.done = k
            _log_progress(run, state, k, total)
            if k == total:       # before the last report: ASHA stops a trial at max_t there
                _finish(run, state, benchmarks)
            _report(state, k, total, benchmarks)
    except Exception as e:    # not BaseException: a trial Tune stops is not a failure
        _fail(run, e)
        raise


# ---- stages ---------------------------------------------------------------------------------

def _pretrain(ctx: TrialContext, point: TrialPoint, name: str, trial_dir: str, run_id: str,
              state: TrialState) -> None:
    from vlp.platform.pretrain_job import pretrain
    from vlp.platform.sweep.trial_configs import pretrain_config

    exp = pretrain_config(ctx.cfg, point, trial=name, trial_dir=trial_dir)
    result = pretrain(exp, parent_run_id=run_id,
                      say=lambda line: print(f"[sweep] {name} {line}", flush=True))
    if not result.completed or not result.checkpoint_path:
        raise RuntimeError(f"pretraining of {name} stopped at step {result.final_step} of "
                           f"{exp.total_steps()} without a final checkpoint")
    state.checkpoint = result.checkpoint_path
    state.steps += result.final_step
    losses = [h.get("loss") for h in result.history if isinstance(h.get("loss"), float)]
    tail = losses[-10:]
    state.pretrain_loss = sum(tail) / len(tail) if tail else None


def _finetune(ctx: TrialContext, point: TrialPoint, name: str, trial_dir: str, run_id: str,
              bench: str, state: TrialState) -> None:
    from vlp.platform.finetune import finetune_and_evaluate
    from vlp.platform.sweep.trial_configs import finetune_kwargs

    report = finetune_and_evaluate(**finetune_kwargs(
        ctx.cfg, point, state.checkpoint, bench, trial=name, trial_dir=trial_dir,
        parent_run_id=run_id))
    state.scores.update({k: float(v) for k, v in report.scores.items()})
    state.steps += sum(b.steps for b in report.benchmarks.values())


# ---- a search proposing a point it already ran -------------------------------------------------

def _finished_twin(ctx: TrialContext, point: TrialPoint, own_run_id: str
                   ) -> tuple[str, dict[str, float]] | None:
    """(name, metrics) of a completed trial of this sweep with the same point. TPE re-proposes
    good points of a small categorical space; training them again would only re-measure seed
    noise at full cost."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(ctx.cfg.mlflow.tracking_uri)
    parent = client.get_run(ctx.parent_run_id)
    runs = client.search_runs(
        [parent.info.experiment_id], max_results=5,
        filter_string=f"tags.`mlflow.parentRunId` = '{ctx.parent_run_id}' and "
                      f"tags.`vlp.point_key` = '{point.key()}' and tags.`vlp.state` = 'completed'")
    for r in runs:
        if r.info.run_id != own_run_id and "score" in r.data.metrics:
            return r.data.tags.get(TRIAL_TAG, r.info.run_name), dict(r.data.metrics)
    return None


def _replay_twin(run: Any, state: TrialState, twin: tuple[str, dict[str, float]],
                 benchmarks: list[str]) -> None:
    """Report the twin's stage results (no steps spent), so Optuna and ASHA see them."""
    from vlp.platform.finetune.benchmarks import get_benchmark

    name, metrics = twin
    run.set_tags({"vlp.duplicate_of": name})
    state.pretrain_loss = metrics.get("pretrain_loss")
    total = len(benchmarks)
    state.done = 0
    _report(state, 0, total, benchmarks)
    for k, bench in enumerate(benchmarks, 1):
        for part in get_benchmark(bench).meta_parts:
            if metric_key(part) in metrics:
                state.scores[part] = float(metrics[metric_key(part)])
        state.done = k
        if k == total:
            _finish(run, state, benchmarks)
        _report(state, k, total, benchmarks)


# ---- Tune reports -----------------------------------------------------------------------------

def result_metrics(state: TrialState, stage: int, total: int) -> dict[str, Any]:
    """What a trial reports: ``stage`` (ASHA's time), ``score`` (the Meta-Sum parts so far:
    the objective), each part, Meta-Sum once all five parts are in, and the compute spent."""
    out: dict[str, Any] = {"stage": stage, "stages": total,
                           "score": float(sum(state.scores.values())),
                           "trial_steps": state.steps, "trial_seconds": state.seconds,
                           "mlflow_run_id": state.mlflow_run_id or ""}
    out.update({metric_key(k): v for k, v in state.scores.items()})
    if all(p in state.scores for p in META_SUM_PARTS):
        out["meta_sum"] = meta_sum(state.scores)
    if state.pretrain_loss is not None:
        out["pretrain_loss"] = state.pretrain_loss
    return out


def _report(state: TrialState, stage: int, total: int, benchmarks: list[str],
            extra: dict[str, Any] | None = None) -> None:
    import ray.tune

    metrics = {**result_metrics(state, stage, total), **(extra or {}),
               "benchmark": benchmarks[stage - 1] if stage else "pretrain"}
    with tempfile.TemporaryDirectory(prefix="vlp-sweep-trial-") as tmp:
        Path(tmp, STATE_FILE).write_text(json.dumps(asdict(state)))
        ray.tune.report(metrics, checkpoint=ray.tune.Checkpoint.from_directory(tmp))


def _load_state(checkpoint: Any) -> TrialState:
    if checkpoint is None:
        return TrialState()
    with checkpoint.as_directory() as folder:
        return TrialState(**json.loads(Path(folder, STATE_FILE).read_text()))


def _log_attempt(trial_dir: str, state: TrialState) -> None:
    with open(Path(trial_dir) / ATTEMPTS_FILE, "a") as f:
        f.write(json.dumps({"time": time.time(), "pid": os.getpid(),
                            "resumed_after_stage": state.done}) + "\n")


# ---- MLflow -----------------------------------------------------------------------------------

def _open_run(ctx: TrialContext, name: str, point: TrialPoint, fresh: bool):
    from vlp.platform.sweep.tracking import open_trial_run

    return open_trial_run(ctx.cfg, ctx.parent_run_id, ctx.instance, name, point, fresh=fresh)


def _log_progress(run: Any, state: TrialState, stage: int, total: int) -> None:
    try:
        run.log_metrics({**{metric_key(k): v for k, v in state.scores.items()},
                         "score": float(sum(state.scores.values())), "stage": stage,
                         "stages": total, "trial_steps": state.steps,
                         "trial_seconds": state.seconds}, step=stage)
    except Exception as e:     # tracking must not kill a trial; the driver logs the summary
        print(f"[sweep] warning: MLflow logging failed ({type(e).__name__}: {e})", flush=True)


def _finish(run: Any, state: TrialState, benchmarks: list[str]) -> None:
    metrics = result_metrics(state, len(benchmarks), len(benchmarks))
    final = {k: v for k, v in metrics.items() if isinstance(v, (int, float))}
    run.log_metrics(final, step=len(benchmarks))
    run.set_tags({"vlp.state": "completed"})
    run.finish("FINISHED")


def _fail(run: Any, error: BaseException) -> None:
    try:
        text = f"{type(error).__name__}: {error}".splitlines()[0][:500]
        run.set_tags({"vlp.state": "failed", "vlp.error": text})
        run.finish("FAILED")
    except Exception:
        pass   # the trial's own error is the one to show
