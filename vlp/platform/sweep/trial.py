"""One sweep trial, a Ray Tune function trainable: pretrain the point's config (unless it is
the no-pretraining point), then finetune and evaluate on each benchmark in turn, reporting
to Tune after every stage.

    stage 0            pretraining (vlp.platform.pretrain.job.pretrain)      score 0
    stage k = 1..B     finetune + evaluate benchmark k (finetune_and_evaluate)  score = the
                       Meta-Sum parts so far (sum of the scores of benchmarks 1..k)

``stage`` is ASHA's ``time_attr``: every trial finetunes the benchmarks in the same order, so
scores at the same stage compare. Each report carries a small Tune checkpoint (what is done,
the pretraining checkpoint path, the scores): a trial resumed by ``Tuner.restore`` skips its
finished stages, and its Ray Train runs have deterministic names, so an interrupted
pretraining resumes from its own last checkpoint.

Replicates (``sweep.seeds`` K > 1, or ``include_seeds`` for the ``include`` points): each
stage runs once per replicate (training seeds seed, seed+1, ...) and the report after the
stage carries the replicates' mean, so ASHA cuts and Optuna learns on the mean. Every
finished (replicate, stage) is written to ``replicates.json`` in the trial's folder at once:
a trial interrupted between replicates resumes with the unfinished ones only.

MLflow: the trial's run is a child of the sweep's parent run; the pretraining run and each
finetune run nest under the trial's run. The trial's run holds the mean of each part and,
per replicate, ``seed<k>.<part>`` (what the leaderboard's intervals come from).
"""

from __future__ import annotations

import json
import math
import os
import posixpath
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from vlp.benchmarks.meta_sum import complete, meta_sum, metric_key, parts_of
from vlp.platform.tracking.leaderboard_view import META_SUM_COLUMN
from vlp.platform.sweep.sweep_config import SweepConfig
from vlp.platform.sweep.point import TrialPoint
from vlp.platform.cluster.run_storage import open_location

STATE_FILE = "sweep_trial.json"
REPLICATES_FILE = "replicates.json"  # per-replicate progress, written after each (replicate, stage)
ATTEMPTS_FILE = "attempts.jsonl"     # one line per start of the trial function (resume audit)
TRIAL_TAG = "vlp.sweep.trial"
JOB_TAG_VALUE = "sweep-trial"


class NonFiniteScore(ValueError):
    """A benchmark's score came back NaN or ±inf: the trial is failed, never ranked."""


@dataclass
class TrialContext:
    """What every trial needs besides its point; small and picklable (``tune.with_parameters``)."""
    cfg: SweepConfig                  # resolved (absolute paths, tracking URI)
    parent_run_id: str
    instance: str                     # this sweep's id (see run._check_resume)
    trials_dir: str                   # <sweep storage>/trials-<instance>: a folder per trial
    lines: dict[str, dict[str, Any]] = field(default_factory=dict)   # replay: line → point params
    # search: point key → replicates of the include points named in sweep.include_seeds
    include_seeds: dict[str, int] = field(default_factory=dict)

    def seeds_for(self, point: TrialPoint) -> list[int]:
        """The training seeds of the point's replicates."""
        s = self.cfg.sweep
        k = self.include_seeds.get(point.key(), s.seeds)
        return [s.seed + i for i in range(k)]


@dataclass
class Replicate:
    seed: int
    done: int = -1                    # last stage this replicate finished
    checkpoint: str | None = None     # its pretraining checkpoint (None: no pretraining)
    scores: dict[str, float] = field(default_factory=dict)   # its Meta-Sum parts so far
    steps: int = 0
    seconds: float = 0.0
    pretrain_loss: float | None = None


@dataclass
class TrialState:
    done: int = -1                    # last stage every replicate finished (-1: none)
    scores: dict[str, float] = field(default_factory=dict)   # Meta-Sum parts so far (mean)
    steps: int = 0                    # optimizer steps spent: pretraining + finetunes, all seeds
    seconds: float = 0.0              # wall time of the finished (replicate, stage)s
    pretrain_loss: float | None = None    # mean over replicates
    mlflow_run_id: str | None = None
    replicates: list[Replicate] = field(default_factory=list)

    def gather(self) -> None:
        """The trial's figures from its replicates': means of the parts every replicate has,
        sums of the compute."""
        reps = self.replicates
        self.done = min((r.done for r in reps), default=-1)
        self.steps = sum(r.steps for r in reps)
        self.seconds = sum(r.seconds for r in reps)
        parts = set.intersection(*(set(r.scores) for r in reps)) if reps else set()
        self.scores = {p: sum(r.scores[p] for r in reps) / len(reps) for p in sorted(parts)}
        losses = [r.pretrain_loss for r in reps if r.pretrain_loss is not None]
        self.pretrain_loss = sum(losses) / len(losses) if losses and len(losses) == len(reps) \
            else None

    @classmethod
    def from_json(cls, data: dict[str, Any], first_seed: int = 0) -> "TrialState":
        reps = [Replicate(**r) for r in data.pop("replicates", [])]
        if not reps and data.get("done", -1) >= 0:
            # a checkpoint written before replicates: one trial state is its one replicate
            reps = [Replicate(first_seed, data["done"], data.get("checkpoint"),
                              dict(data.get("scores") or {}), int(data.get("steps", 0)),
                              float(data.get("seconds", 0.0)), data.get("pretrain_loss"))]
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in known}, replicates=reps)


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

    from vlp.platform.training.gpu_placement import set_allocator

    set_allocator()             # before this trial's first CUDA allocation

    name, point = trial_identity(config, ctx)
    cfg = ctx.cfg
    # a path or a URI in the sweep's storage: trials run on any node of the cluster
    trial_dir = posixpath.join(ctx.trials_dir, name)
    open_location(trial_dir).create_root()
    state = _resume_state(ray.tune.get_checkpoint(), trial_dir, ctx.seeds_for(point))
    _log_attempt(trial_dir, state)
    benchmarks = list(cfg.finetune.benchmarks)
    total = len(benchmarks)
    run = _open_run(ctx, name, point, fresh=state.done < 0)
    state.mlflow_run_id = run.run_id
    say = lambda text: print(f"[sweep] {name} {text}", flush=True)  # noqa: E731
    if state.done >= total:     # interrupted between its last stage and Tune noting it
        _finish(run, state, benchmarks)
        return
    seeds = [r.seed for r in state.replicates]
    if state.done >= 0 or any(r.done >= 0 for r in state.replicates):
        say(f"resumes after stage {state.done}/{total}, replicates at stages "
            f"{[r.done for r in state.replicates]} ({point.describe()})")
    elif not ctx.lines:
        twin = _finished_twin(ctx, point, run.run_id)
        if twin is not None:
            say(f"same point as {twin[0]} (finished): its results are reused, no compute")
            _replay_twin(run, state, twin, benchmarks)
            return
    if len(seeds) > 1:
        say(f"{len(seeds)} replicates (training seeds {', '.join(map(str, seeds))}); the "
            f"search and ASHA see their mean")
    try:
        for stage in range(state.done + 1, total + 1):
            for rep in state.replicates:
                if rep.done >= stage:          # a finished replicate is never rerun
                    continue
                _run_stage(ctx, point, name, trial_dir, run.run_id, benchmarks, stage, rep,
                           len(seeds), say)
                _save_replicates(trial_dir, state)
            state.gather()
            if stage == 0:
                _report(state, 0, total, benchmarks, extra={"pretrain_seconds": state.seconds})
                continue
            _log_progress(run, state, stage, total)
            if stage == total:   # before the last report: ASHA stops a trial at max_t there
                _finish(run, state, benchmarks)
            _report(state, stage, total, benchmarks)
    except Exception as e:    # not BaseException: a trial Tune stops is not a failure
        _fail(run, e)
        raise


def _run_stage(ctx: TrialContext, point: TrialPoint, name: str, trial_dir: str, run_id: str,
               benchmarks: list[str], stage: int, rep: Replicate, replicates: int,
               say: Any) -> None:
    """One stage of one replicate: pretraining (stage 0) or one benchmark's finetune."""
    total = len(benchmarks)
    who = name if replicates == 1 else f"{name}-seed{rep.seed}"
    of = "" if replicates == 1 else f" (seed {rep.seed})"
    t0 = time.perf_counter()
    if stage == 0:
        if point.pretrains:
            say(f"stage 0/{total}{of}: pretraining {point.describe()}")
            _pretrain(ctx, point, who, trial_dir, run_id, rep)
        elif rep.seed == ctx.seeds_for(point)[0]:      # once, not once per replicate
            say(f"stage 0/{total}: no pretraining ({point.describe()}); finetunes start "
                f"from the init")
    else:
        bench = benchmarks[stage - 1]
        say(f"stage {stage}/{total}{of}: finetune + evaluate {bench}")
        _finetune(ctx, point, who, trial_dir, run_id, bench, rep)
    rep.seconds += time.perf_counter() - t0
    rep.done = stage


# ---- stages ---------------------------------------------------------------------------------

def _pretrain(ctx: TrialContext, point: TrialPoint, name: str, trial_dir: str, run_id: str,
              state: Replicate) -> None:
    from vlp.platform.pretrain.job import pretrain
    from vlp.platform.sweep.trial_configs import pretrain_config

    exp = pretrain_config(ctx.cfg, point, trial=name, trial_dir=trial_dir, seed=state.seed)
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
              bench: str, state: Replicate) -> None:
    from vlp.platform.finetune import finetune_and_evaluate
    from vlp.platform.sweep.trial_configs import finetune_kwargs

    report = finetune_and_evaluate(**finetune_kwargs(
        ctx.cfg, point, state.checkpoint, bench, trial=name, trial_dir=trial_dir,
        parent_run_id=run_id, seed=state.seed))
    state.steps += sum(b.steps for b in report.benchmarks.values())
    bad = {k: v for k, v in report.scores.items() if not math.isfinite(v)}
    if bad:    # never averaged into the search's objective: the trial fails, sorted last
        raise NonFiniteScore(f"{bench} scored {', '.join(f'{k}={v}' for k, v in bad.items())}"
                             f" for {name}: a non-finite Meta-Sum part fails the trial")
    state.scores.update({k: float(v) for k, v in report.scores.items()})


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
    name, metrics = twin
    run.set_tags({"vlp.duplicate_of": name})
    state.pretrain_loss = metrics.get("pretrain_loss")
    total = len(benchmarks)
    state.done = 0
    _report(state, 0, total, benchmarks)
    for k, bench in enumerate(benchmarks, 1):
        for part in parts_of(bench):
            if part.key in metrics:
                state.scores[part.name] = float(metrics[part.key])
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
    if complete(state.scores):
        out["meta_sum"] = meta_sum(state.scores)
    if state.pretrain_loss is not None:
        out["pretrain_loss"] = state.pretrain_loss
    if state.replicates:
        out["seeds"] = len(state.replicates)
    return out


def replicate_metrics(state: TrialState) -> dict[str, float]:
    """Each replicate's parts (and Meta-Sum once complete) as ``seed<k>.<part>``: the
    leaderboard's per-seed values."""
    out: dict[str, float] = {}
    for r in state.replicates:
        out.update({f"seed{r.seed}.{metric_key(k)}": v for k, v in r.scores.items()})
        if complete(r.scores):
            out[f"seed{r.seed}.meta_sum"] = meta_sum(r.scores)
    return out


def _report(state: TrialState, stage: int, total: int, benchmarks: list[str],
            extra: dict[str, Any] | None = None) -> None:
    import ray.tune

    metrics = {**result_metrics(state, stage, total), **(extra or {}),
               "benchmark": benchmarks[stage - 1] if stage else "pretrain"}
    with tempfile.TemporaryDirectory(prefix="vlp-sweep-trial-") as tmp:
        Path(tmp, STATE_FILE).write_text(json.dumps(asdict(state)))
        ray.tune.report(metrics, checkpoint=ray.tune.Checkpoint.from_directory(tmp))


def _load_state(checkpoint: Any, first_seed: int = 0) -> TrialState:
    if checkpoint is None:
        return TrialState()
    with checkpoint.as_directory() as folder:
        return TrialState.from_json(json.loads(Path(folder, STATE_FILE).read_text()),
                                    first_seed)


def _resume_state(checkpoint: Any, trial_dir: str, seeds: list[int]) -> TrialState:
    """The state of Tune's last checkpoint, or the replicates file when it is further on
    (replicates finished after the last report); replicates missing from both start fresh."""
    state = _load_state(checkpoint, seeds[0])
    folder = open_location(trial_dir)
    if folder.exists(REPLICATES_FILE):
        saved = TrialState.from_json(json.loads(folder.read_text(REPLICATES_FILE)))
        if _progress(saved.replicates) > _progress(state.replicates):
            state.replicates = saved.replicates
    have = {r.seed for r in state.replicates}
    state.replicates += [Replicate(seed) for seed in seeds if seed not in have]
    state.replicates = [r for r in state.replicates if r.seed in seeds]
    state.gather()
    return state


def _progress(replicates: list[Replicate]) -> int:
    """Stages finished, summed over the replicates (an absent replicate has finished none:
    one replicate done with stage 0 is further on than no Tune checkpoint at all)."""
    return sum(r.done + 1 for r in replicates)


def _save_replicates(trial_dir: str, state: TrialState) -> None:
    open_location(trial_dir).write_text(json.dumps(asdict(state)), REPLICATES_FILE)


def _log_attempt(trial_dir: str, state: TrialState) -> None:
    """One line more in the attempts file (rewritten whole: object stores cannot append; one
    attempt of a trial runs at a time)."""
    folder = open_location(trial_dir)
    before = folder.read_text(ATTEMPTS_FILE) if folder.exists(ATTEMPTS_FILE) else ""
    folder.write_text(before + json.dumps({"time": time.time(), "pid": os.getpid(),
                                           "resumed_after_stage": state.done}) + "\n",
                      ATTEMPTS_FILE)


# ---- MLflow -----------------------------------------------------------------------------------

def _open_run(ctx: TrialContext, name: str, point: TrialPoint, fresh: bool):
    from vlp.platform.sweep.tracking import open_trial_run

    return open_trial_run(ctx.cfg, ctx.parent_run_id, ctx.instance, name, point, fresh=fresh)


def _log_progress(run: Any, state: TrialState, stage: int, total: int) -> None:
    try:
        run.log_metrics({**{metric_key(k): v for k, v in state.scores.items()},
                         **replicate_metrics(state),
                         "score": float(sum(state.scores.values())), "stage": stage,
                         "stages": total, "trial_steps": state.steps,
                         "trial_seconds": state.seconds}, step=stage)
    except Exception as e:     # tracking must not kill a trial; the driver logs the summary
        print(f"[sweep] warning: MLflow logging failed ({type(e).__name__}: {e})", flush=True)


def _finish(run: Any, state: TrialState, benchmarks: list[str]) -> None:
    metrics = result_metrics(state, len(benchmarks), len(benchmarks))
    final = {k: v for k, v in metrics.items() if isinstance(v, (int, float))}
    if "meta_sum" in final:       # the leaderboard view's column (the driver logs the mean)
        final[META_SUM_COLUMN] = round(final["meta_sum"], 2)
    run.log_metrics({**final, **replicate_metrics(state)}, step=len(benchmarks))
    run.set_tags({"vlp.state": "completed"})
    run.finish("FINISHED")


def _fail(run: Any, error: BaseException) -> None:
    try:
        text = f"{type(error).__name__}: {error}".splitlines()[0][:500]
        run.set_tags({"vlp.state": "failed", "vlp.error": text})
        run.finish("FAILED")
    except Exception:
        pass   # the trial's own error is the one to show
