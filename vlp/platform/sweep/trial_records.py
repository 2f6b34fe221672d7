"""What a sweep trial records: its Tune reports (``stage``: ASHA's time; ``score``: the
objective; a small checkpoint of the trial's state) and its MLflow run (a child of the
sweep's parent run: the mean of each part and, per replicate, ``seed<k>.<part>``, what the
leaderboard's intervals come from).
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

from vlp.benchmarks.meta_sum import complete, meta_sum, metric_key
from vlp.platform.tracking.leaderboard_view import META_SUM_COLUMN
from vlp.platform.sweep.point import TrialPoint
from vlp.platform.sweep.trial_state import STATE_FILE, TrialState

TRIAL_TAG = "vlp.sweep.trial"
JOB_TAG_VALUE = "sweep-trial"


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


def report(state: TrialState, stage: int, total: int, benchmarks: list[str],
            extra: dict[str, Any] | None = None) -> None:
    import ray.tune

    metrics = {**result_metrics(state, stage, total), **(extra or {}),
               "benchmark": benchmarks[stage - 1] if stage else "pretrain"}
    with tempfile.TemporaryDirectory(prefix="vlp-sweep-trial-") as tmp:
        Path(tmp, STATE_FILE).write_text(json.dumps(asdict(state)))
        ray.tune.report(metrics, checkpoint=ray.tune.Checkpoint.from_directory(tmp))


# ---- MLflow -----------------------------------------------------------------------------------

def open_run(ctx: Any, name: str, point: TrialPoint, fresh: bool):
    from vlp.platform.sweep.tracking import open_trial_run

    return open_trial_run(ctx.cfg, ctx.parent_run_id, ctx.instance, name, point, fresh=fresh)


def log_progress(run: Any, state: TrialState, stage: int, total: int) -> None:
    try:
        run.log_metrics({**{metric_key(k): v for k, v in state.scores.items()},
                         **replicate_metrics(state),
                         "score": float(sum(state.scores.values())), "stage": stage,
                         "stages": total, "trial_steps": state.steps,
                         "trial_seconds": state.seconds}, step=stage)
    except Exception as e:     # tracking must not kill a trial; the driver logs the summary
        print(f"[sweep] warning: MLflow logging failed ({type(e).__name__}: {e})", flush=True)


def finish(run: Any, state: TrialState, benchmarks: list[str]) -> None:
    metrics = result_metrics(state, len(benchmarks), len(benchmarks))
    final = {k: v for k, v in metrics.items() if isinstance(v, (int, float))}
    if "meta_sum" in final:       # the leaderboard view's column (the driver logs the mean)
        final[META_SUM_COLUMN] = round(final["meta_sum"], 2)
    run.log_metrics({**final, **replicate_metrics(state)}, step=len(benchmarks))
    run.set_tags({"vlp.state": "completed"})
    run.finish("FINISHED")


def fail(run: Any, error: BaseException) -> None:
    try:
        text = f"{type(error).__name__}: {error}".splitlines()[0][:500]
        run.set_tags({"vlp.state": "failed", "vlp.error": text})
        run.finish("FAILED")
    except Exception:
        pass   # the trial's own error is the one to show
