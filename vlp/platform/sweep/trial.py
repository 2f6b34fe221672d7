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

Here: the trial's course and its stages; its state and resume files in ``trial_state``, its
Tune reports and MLflow records in ``trial_records``, a re-proposed point in ``trial_twin``.
"""

from __future__ import annotations

import math
import posixpath
import time
from dataclasses import dataclass, field
from typing import Any

from vlp.platform.sweep.sweep_config import SweepConfig
from vlp.platform.sweep.point import TrialPoint
from vlp.platform.cluster.run_storage import open_location
from vlp.platform.sweep import trial_records as records
from vlp.platform.sweep.trial_state import Replicate, log_attempt, resume_state, save_replicates
from vlp.platform.sweep.trial_twin import finished_twin, replay_twin
from vlp.platform.training.worker_group import WorkerGroup


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
    state = resume_state(ray.tune.get_checkpoint(), trial_dir, ctx.seeds_for(point))
    log_attempt(trial_dir, state)
    benchmarks = list(cfg.finetune.benchmarks)
    total = len(benchmarks)
    run = records.open_run(ctx, name, point, fresh=state.done < 0)
    state.mlflow_run_id = run.run_id
    say = lambda text: print(f"[sweep] {name} {text}", flush=True)  # noqa: E731
    if state.done >= total:     # interrupted between its last stage and Tune noting it
        records.finish(run, state, benchmarks)
        # the last stage's result, reported again: Tune's last result is otherwise the one
        # restored (an earlier stage), and the sweep would call the trial stopped by ASHA
        records.report(state, total, total, benchmarks)
        return
    seeds = [r.seed for r in state.replicates]
    if state.done >= 0 or any(r.done >= 0 for r in state.replicates):
        say(f"resumes after stage {state.done}/{total}, replicates at stages "
            f"{[r.done for r in state.replicates]} ({point.describe()})")
    elif not ctx.lines:
        twin = finished_twin(ctx, point, run.run_id)
        if twin is not None:
            say(f"same point as {twin[0]} (finished): its results are reused, no compute")
            replay_twin(run, state, twin, benchmarks)
            return
    if len(seeds) > 1:
        say(f"{len(seeds)} replicates (training seeds {', '.join(map(str, seeds))}); the "
            f"search and ASHA see their mean")
    # the trial's finetunes, all stages and seeds, run on one kept worker group (started at
    # the first, ended with the trial): a Ray Train run each would start its workers anew
    group = WorkerGroup()
    try:
        for stage in range(state.done + 1, total + 1):
            for rep in state.replicates:
                if rep.done >= stage:          # a finished replicate is never rerun
                    continue
                _run_stage(ctx, point, name, trial_dir, run.run_id, benchmarks, stage, rep,
                           len(seeds), say, group)
                save_replicates(trial_dir, state)
            state.gather()
            if stage == 0:
                records.report(state, 0, total, benchmarks,
                               extra={"pretrain_seconds": state.seconds})
                continue
            records.log_progress(run, state, stage, total)
            if stage == total:   # before the last report: ASHA stops a trial at max_t there
                records.finish(run, state, benchmarks)
            records.report(state, stage, total, benchmarks)
    except Exception as e:    # not BaseException: a trial Tune stops is not a failure
        records.fail(run, e)
        raise
    finally:
        group.close()


def _run_stage(ctx: TrialContext, point: TrialPoint, name: str, trial_dir: str, run_id: str,
               benchmarks: list[str], stage: int, rep: Replicate, replicates: int,
               say: Any, group: WorkerGroup | None = None) -> None:
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
        _finetune(ctx, point, who, trial_dir, run_id, bench, rep, group=group)
    rep.seconds += time.perf_counter() - t0
    rep.done = stage


# ---- stages -----------------------------------------------------------------------------------

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
              bench: str, state: Replicate, group: WorkerGroup | None = None) -> None:
    from vlp.platform.finetune import finetune_and_evaluate
    from vlp.platform.sweep.trial_configs import finetune_kwargs

    report = finetune_and_evaluate(**finetune_kwargs(
        ctx.cfg, point, state.checkpoint, bench, trial=name, trial_dir=trial_dir,
        parent_run_id=run_id, seed=state.seed), group=group)
    state.steps += sum(b.steps for b in report.benchmarks.values())
    bad = {k: v for k, v in report.scores.items() if not math.isfinite(v)}
    if bad:    # never averaged into the search's objective: the trial fails, sorted last
        raise NonFiniteScore(f"{bench} scored {', '.join(f'{k}={v}' for k, v in bad.items())}"
                             f" for {name}: a non-finite Meta-Sum part fails the trial")
    state.scores.update({k: float(v) for k, v in report.scores.items()})
