"""A search proposing a point it already ran: TPE re-proposes good points of a small
categorical space; training them again would only re-measure seed noise at full cost, so the
trial reports the finished twin's results instead (no steps spent).
"""

from __future__ import annotations

from typing import Any

from vlp.benchmarks.meta_sum import parts_of
from vlp.platform.sweep.point import TrialPoint
from vlp.platform.sweep.trial_records import TRIAL_TAG, finish, report
from vlp.platform.sweep.trial_state import TrialState


def finished_twin(ctx: Any, point: TrialPoint, own_run_id: str
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


def replay_twin(run: Any, state: TrialState, twin: tuple[str, dict[str, float]],
                 benchmarks: list[str]) -> None:
    """Report the twin's stage results (no steps spent), so Optuna and ASHA see them."""
    name, metrics = twin
    run.set_tags({"vlp.duplicate_of": name})
    state.pretrain_loss = metrics.get("pretrain_loss")
    total = len(benchmarks)
    state.done = 0
    report(state, 0, total, benchmarks)
    for k, bench in enumerate(benchmarks, 1):
        for part in parts_of(bench):
            if part.key in metrics:
                state.scores[part.name] = float(metrics[part.key])
        state.done = k
        if k == total:
            finish(run, state, benchmarks)
        report(state, k, total, benchmarks)
