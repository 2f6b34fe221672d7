"""A sweep's leaderboard, read from MLflow: one row per trial in UNITER Table 3's columns.

    board = load_leaderboard(tracking_uri, parent_run_id)     # or find_sweep_run(...) first
    print(board.markdown())
    board.rows[0].meta_sum, board.rows[0].scores["vqa"]

The rows come from the trial runs' metrics and tags, so the table logged on the sweep's
parent run and the one ``vlp leaderboard`` prints are the same numbers. A replay lists its
lines in the paper's order; a search ranks by Meta-Sum (then by the score so far, for trials
stopped early or still running).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

PARTS = (("vqa", "VQA"), ("ir", "IR"), ("tr", "TR"), ("nlvr2", "NLVR2"),
         ("refcoco_plus", "RefCOCO+"))       # metric key on the trial run → Table 3 column
SWEEP_JOB, TRIAL_JOB = "sweep", "sweep-trial"      # vlp.platform.sweep.tracking


class LeaderboardError(LookupError):
    """No sweep to show; the message says where it looked."""


@dataclass
class Row:
    trial: str
    data: str                   # pre-training data (Table 3's first column)
    tasks: str                  # the task mix, e.g. MLM+ITM+MRC-kl
    ratios: str
    init: str
    meta_sum: float | None
    scores: dict[str, float | None]
    score: float | None         # the Meta-Sum parts so far (ASHA's and Optuna's objective)
    stage: int | None
    stages: int | None
    state: str                  # completed | stopped | failed | running
    steps: int | None           # optimizer steps spent (pretraining + finetunes)
    seconds: float | None
    run_id: str
    error: str = ""

    def status(self) -> str:
        if self.state == "completed":
            return "done"
        where = f" after stage {self.stage}/{self.stages}" if self.stage is not None else ""
        if self.state == "stopped":
            return f"stopped by ASHA{where}"
        if self.state == "failed":
            return f"failed{where}: {self.error}" if self.error else f"failed{where}"
        return f"running{where}"


@dataclass
class Leaderboard:
    sweep: str
    mode: str                   # search | replay:<name>
    parent_run_id: str
    rows: list[Row] = field(default_factory=list)

    def best(self) -> Row | None:
        done = [r for r in self.rows if r.meta_sum is not None]
        return max(done, key=lambda r: r.meta_sum) if done else None

    def markdown(self) -> str:
        head = ["#", "Trial", "Pre-training data", "Pre-training tasks", "Ratios", "Init",
                "Meta-Sum"] + [label for _, label in PARTS] + ["Steps", "Status"]
        lines = [_md_row(head), _md_row(["---:" if h in _NUMERIC else "---" for h in head])]
        for i, r in enumerate(self.rows, 1):
            cells = [str(i), r.trial, r.data, r.tasks, r.ratios, r.init, _num(r.meta_sum)]
            cells += [_num(r.scores.get(k)) for k, _ in PARTS]
            cells += ["" if r.steps is None else f"{r.steps:,}", r.status()]
            lines.append(_md_row(cells))
        return "\n".join(lines) + "\n"


_NUMERIC = {"#", "Meta-Sum", "Steps"} | {label for _, label in PARTS}


def _md_row(cells: list[str]) -> str:
    return "| " + " | ".join(c.replace("|", "/") for c in cells) + " |"


def _num(v: float | None) -> str:
    return "–" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.2f}"


# ---- reading MLflow ---------------------------------------------------------------------------

def find_sweep_run(tracking_uri: str, experiment: str | None = None, *,
                   sweep: str | None = None) -> Any:
    """The latest sweep parent run (of ``experiment``, named ``sweep`` when given)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    if experiment:
        exp = client.get_experiment_by_name(experiment)
        if exp is None:
            names = [e.name for e in client.search_experiments()]
            raise LeaderboardError(f"no MLflow experiment {experiment!r} in {_shown(tracking_uri)}"
                                   f"; experiments there: {', '.join(names) or 'none'}")
        ids = [exp.experiment_id]
    else:
        ids = [e.experiment_id for e in client.search_experiments()]
    query = f"tags.`vlp.job` = '{SWEEP_JOB}'"
    if sweep:
        query += f" and attributes.run_name = '{sweep}'"
    runs = client.search_runs(ids, filter_string=query, order_by=["attributes.start_time DESC"],
                              max_results=1) if ids else []
    if not runs:
        where = f"experiment {experiment!r}" if experiment else "any experiment"
        named = f" named {sweep!r}" if sweep else ""
        raise LeaderboardError(f"no sweep{named} in {where} of {_shown(tracking_uri)} (run "
                               f"`vlp sweep` or `vlp demo` first)")
    return runs[0]


def load_leaderboard(tracking_uri: str, parent_run_id: str) -> Leaderboard:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    parent = client.get_run(parent_run_id)
    mode = parent.data.tags.get("vlp.sweep.mode", "search")
    trials = client.search_runs(
        [parent.info.experiment_id], max_results=10_000,
        filter_string=f"tags.`mlflow.parentRunId` = '{parent_run_id}' and "
                      f"tags.`vlp.job` = '{TRIAL_JOB}'")
    rows = [_row(t) for t in trials]
    if mode.startswith("replay"):
        rows.sort(key=lambda r: r.trial)
    else:
        rows.sort(key=lambda r: (r.meta_sum is None, -(r.meta_sum or 0.0), -(r.score or 0.0),
                                 r.trial))
    return Leaderboard(parent.info.run_name, mode, parent_run_id, rows)


def _row(run: Any) -> Row:
    m, t = run.data.metrics, run.data.tags
    status = run.info.status
    state = t.get("vlp.state") or {"FINISHED": "completed", "FAILED": "failed",
                                   "KILLED": "stopped"}.get(status, "running")
    if state == "running" and status in ("FAILED", "KILLED"):   # closed by the driver
        state = "failed" if status == "FAILED" else "stopped"
    as_int = lambda k: int(m[k]) if k in m else None   # noqa: E731
    return Row(trial=t.get("vlp.sweep.trial", run.info.run_name), data=t.get("pretraining_data", ""),
               tasks=t.get("mix", ""), ratios=t.get("mix_ratios", ""), init=t.get("init", ""),
               meta_sum=m.get("meta_sum"), scores={k: m.get(k) for k, _ in PARTS},
               score=m.get("score"), stage=as_int("stage"), stages=as_int("stages"),
               state=state, steps=as_int("trial_steps"), seconds=m.get("trial_seconds"),
               run_id=run.info.run_id, error=t.get("vlp.error", ""))


def _shown(uri: str) -> str:
    from vlp.platform.config_loader import redact

    return redact(uri)


# ---- writing to the parent run -----------------------------------------------------------------

LEADERBOARD_MD = "leaderboard/leaderboard.md"
LEADERBOARD_PNG = "leaderboard/meta_sum.png"


def log_leaderboard(tracking_uri: str, board: Leaderboard) -> None:
    """The table (markdown) and the chart (PNG) as artifacts of the sweep's parent run, and
    the best Meta-Sum as a metric."""
    from mlflow.tracking import MlflowClient

    from vlp.platform.leaderboard_plot import leaderboard_figure

    client = MlflowClient(tracking_uri)
    title = f"{board.sweep} ({board.mode})"
    client.log_text(board.parent_run_id, f"# {title}\n\n{board.markdown()}", LEADERBOARD_MD)
    client.log_figure(board.parent_run_id, leaderboard_figure(board, title), LEADERBOARD_PNG)
    best = board.best()
    if best is not None:
        client.log_metric(board.parent_run_id, "best_meta_sum", best.meta_sum)
        client.set_tag(board.parent_run_id, "best_trial", f"{best.trial} {best.tasks}")
    client.log_metric(board.parent_run_id, "trials_completed",
                      sum(r.state == "completed" for r in board.rows))
