"""The MLflow UI as the sweep's leaderboard.

MLflow's runs table has no per-column titles or number formats, but it shows a saved view:
an experiment tag ``mlflow.sharedViewState.<key>`` holding the page's state as JSON (its
search filter, sort, selected columns), opened by ``?viewStateShareKey=<key>`` in the URL
(MLflow's own "share view" link). After each sweep the view ``vlp-leaderboard`` of its
experiment is set to that sweep's trials, sorted by a metric named as the leaderboard
names it, ``Meta-Sum`` (rounded to two decimals: the value the table prints), with its 95%
interval's half-width (``Meta-Sum ci95``), the five Meta-Sum parts as the table prints them
(``VQA``, ``IR``, ``TR``, ``NLVR2``, ``RefCOCO plus``: the line's means, two decimals; MLflow
allows no '+' in a metric name), the mix, the pre-training data and the trial's ``outcome``
(completed, stopped by ASHA after stage k/n, failed: an ASHA-stopped trial's run is
FINISHED, since the UI draws KILLED as the red ✗ of a failure).

``Meta-Sum`` on a trial run is its line's mean Meta-Sum over seeds. A sweep whose
benchmarks leave Meta-Sum parts out (a quick retrieval-only sweep) has no line with a
Meta-Sum; its finished trials then carry the sum of the parts it scores, and the parent
run's tag ``vlp.meta_sum_column`` says which parts that is.
"""

from __future__ import annotations

import json
from typing import Any

from vlp.platform.tracking.leaderboard import PARTS, TRIAL_JOB, Leaderboard

VIEW_KEY = "vlp-leaderboard"
META_SUM_COLUMN = "Meta-Sum"
VIEW_TAG = f"mlflow.sharedViewState.{VIEW_KEY}"
CI_COLUMN = f"{META_SUM_COLUMN} ci95"
OUTCOME_TAG = "outcome"
# the parts as the leaderboard's columns name them, in names MLflow accepts
PART_COLUMNS = tuple((key, label.replace("+", " plus")) for key, label in PARTS)


def view_state(parent_run_id: str) -> dict[str, Any]:
    """The runs page's state: this sweep's trials, best Meta-Sum first."""
    metric = lambda k: f"metrics.`{k}`"          # noqa: E731
    return {
        "searchFilter": (f"tags.`mlflow.parentRunId` = '{parent_run_id}' and "
                         f"tags.`vlp.job` = '{TRIAL_JOB}'"),
        "orderByKey": metric(META_SUM_COLUMN), "orderByAsc": False,
        "selectedColumns": [metric(META_SUM_COLUMN), metric(CI_COLUMN),
                            *(metric(c) for _, c in PART_COLUMNS),
                            "tags.`mix`", "tags.`mix_ratios`", "tags.`pretraining_data`",
                            "tags.`init`", "tags.`vlp.vs_best`", f"tags.`{OUTCOME_TAG}`"],
        "runsExpanded": {}, "runsPinned": [], "runsHidden": [],
    }


def meta_sum_values(board: Leaderboard) -> tuple[dict[str, float], str]:
    """``Meta-Sum`` per trial run id, and what it sums (see the module)."""
    if any(r.meta_sum is not None for r in board.rows):
        return ({r.run_id: round(r.meta_sum, 2) for r in board.rows if r.meta_sum is not None},
                "Meta-Sum (VQA + IR + TR + NLVR2 + RefCOCO+), the mean over the line's seeds")
    done = [r for r in board.rows if r.state == "completed" and r.score is not None]
    scored = [label for key, label in PARTS if any(r.scores.get(key) is not None for r in done)]
    return ({r.run_id: round(r.score, 2) for r in done},
            f"the sum of the parts this sweep scores ({' + '.join(scored) or 'none'}): its "
            f"benchmarks leave the other Meta-Sum parts out")


def printed_columns(board: Leaderboard) -> dict[str, dict[str, float]]:
    """Per trial run: its line's parts and Meta-Sum interval as ``vlp leaderboard`` prints
    them (means, two decimals; the interval's half-width where the line has one)."""
    out: dict[str, dict[str, float]] = {}
    for r in board.rows:
        columns = {}
        for key, column in PART_COLUMNS:
            value = r.est[key].mean if key in r.est else r.scores.get(key)
            if value is not None:
                columns[column] = round(value, 2)
        ci = r.est["meta_sum"].ci95() if "meta_sum" in r.est else None
        if ci is not None:
            columns[CI_COLUMN] = round(ci, 2)
        if columns:
            out[r.run_id] = columns
    return out


def point_view_at(client: Any, parent_run_id: str) -> None:
    """Make the experiment's leaderboard view this sweep's (when the sweep starts: a user who
    opens the UI mid-sweep sees its trials, finished ones ranked)."""
    experiment_id = client.get_run(parent_run_id).info.experiment_id
    client.set_experiment_tag(experiment_id, VIEW_TAG, json.dumps(view_state(parent_run_id)))


def publish_view(tracking_uri: str, board: Leaderboard) -> None:
    """Log ``Meta-Sum`` on the trial runs (the lines' means) and point the experiment's
    leaderboard view at this sweep."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    values, meaning = meta_sum_values(board)
    for run_id, value in values.items():
        client.log_metric(run_id, META_SUM_COLUMN, value)
    for run_id, columns in printed_columns(board).items():
        for name, value in columns.items():
            client.log_metric(run_id, name, value)
    client.set_tag(board.parent_run_id, "vlp.meta_sum_column", meaning)
    point_view_at(client, board.parent_run_id)


def view_url(server: str, experiment_id: str) -> str:
    """The leaderboard view on the MLflow server at ``server`` (``http://host:port``)."""
    return (f"{server.rstrip('/')}/#/experiments/{experiment_id}/runs?"
            f"workflowType=machine_learning&viewStateShareKey={VIEW_KEY}")


def leaderboard_url(server: str, tracking_uri: str) -> str | None:
    """The view of the experiment holding the latest sweep in ``tracking_uri``, or None."""
    from vlp.platform.tracking.leaderboard import LeaderboardError, find_sweep_run

    try:
        run = find_sweep_run(tracking_uri)
    except LeaderboardError:
        return None
    return view_url(server, run.info.experiment_id)
