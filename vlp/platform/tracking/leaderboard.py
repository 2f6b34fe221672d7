"""A sweep's leaderboard, read from MLflow: one row per point of the space (a line) in UNITER
Table 3's columns, each with its seeds' mean and 95% interval.

    board = load_leaderboard(tracking_uri, parent_run_id)     # or find_sweep_run(...) first
    print(board.markdown())
    board.rows[0].meta_sum, board.rows[0].est["meta_sum"].ci95(), board.rows[0].verdict

The rows come from the trial runs' metrics and tags, so the table logged on the sweep's
parent run and the one ``vlp leaderboard`` prints are the same numbers. A replay lists its
lines in the paper's order; a search ranks by mean Meta-Sum (then by the score so far, for
trials stopped early or still running). A trial that reused a twin's results (the search
proposed a point it had run) is not a line of its own.

Noise (``leaderboard_stats``): a line with several seeds gets mean ± the 95% t-interval of
the mean; a line with one seed gets the pooled spread of the replicated lines when there are
any, and no interval otherwise. The rule for "not distinguishable from the best line" is
Welch's two-sided t-test at 5% on Meta-Sum.

A trial whose Meta-Sum (or any seed's) is NaN or ±inf is a failed line: no Meta-Sum, never
best, no interval, and last in the table (a model that diverged must not top the board; NaN
compares false with everything, so it used to sort first and win ``max``).
"""

from __future__ import annotations

import math
import re
import sys
from dataclasses import dataclass, field
from typing import Any

from vlp.benchmarks import meta_sum
from vlp.platform.tracking.leaderboard_stats import (Estimate, estimate, indistinguishable,
                                                     pooled_variance, welch_p)

PARTS = tuple((p.key, p.label) for p in meta_sum.PARTS)   # metric key on the trial run → column
SWEEP_JOB, TRIAL_JOB = "sweep", "sweep-trial"      # vlp.platform.sweep.tracking
KEYS = ("meta_sum",) + tuple(k for k, _ in PARTS)
_SEED_KEY = re.compile(r"^seed(\d+)\.(.+)$")         # per replicate (sweep/trial.py)


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
    point_key: str = ""
    seed_values: dict[str, list[float]] = field(default_factory=dict)   # key → one per seed
    est: dict[str, Estimate] = field(default_factory=dict)    # key → mean and its noise
    verdict: str = ""          # best | ≈best | below | "" (no noise estimate / not finished)
    p_vs_best: float | None = None
    family: str = ""           # the model family (trial tag; "" in runs logged before it)
    protocol: str = ""         # its finetunes' downstream protocol (leaderboard_protocols.py)
    nonfinite: bool = False    # its Meta-Sum (or a seed's) was NaN/±inf: failed, sorted last

    @property
    def seeds(self) -> int:
        """Replicates with results (a trial stopped early has parts, not Meta-Sum)."""
        return max((len(v) for v in self.seed_values.values()), default=1)

    def cell(self, key: str) -> str:
        """``165.00 ± 12.42`` (mean ± 95% CI half-width), or the mean alone."""
        e = self.est.get(key)
        if e is None:
            return _num(self.meta_sum if key == "meta_sum" else self.scores.get(key))
        ci = e.ci95()
        return _num(e.mean) if ci is None else f"{e.mean:.2f} ± {ci:.2f}"

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
    pooled_from: list[str] = field(default_factory=list)   # lines whose spread is pooled
    pooled_df: float = 0.0

    def best(self) -> Row | None:
        done = [r for r in self.rows if _finite(r.meta_sum)]
        return max(done, key=lambda r: r.meta_sum) if done else None

    def has_intervals(self) -> bool:
        return any(r.est.get("meta_sum") is not None and r.est["meta_sum"].df > 0
                   for r in self.rows)

    def noise_note(self) -> str:
        """How to read the ± and the ≈ marks (printed under every table)."""
        done = [r for r in self.rows if r.meta_sum is not None]
        if not done:
            if any(r.state == "completed" for r in self.rows):
                return ("no line has all five Meta-Sum parts (the sweep's benchmarks leave some "
                        "out): the intervals and the ranking rule are on Meta-Sum, so none here")
            return "no finished line yet"
        seeds = sorted({r.seeds for r in done})
        if not self.has_intervals():
            return ("one seed per line: no noise estimate, so no intervals and no line is "
                    "shown as better than another beyond noise (run with sweep.seeds ≥ 2, or "
                    "sweep.include_seeds: {none: 3} for a pooled estimate)")
        rule = ("± = 95% t-interval of the mean over seeds; ≈best = not distinguishable from "
                "the best line (Welch's two-sided t-test on Meta-Sum, 5%)")
        if seeds[0] == 1:
            rule += (f"; lines with one seed take the pooled spread of "
                     f"{', '.join(self.pooled_from)} ({self.pooled_df:g} degrees of freedom)")
        return f"{'/'.join(map(str, seeds))} seed(s) per line; {rule}"

    def markdown(self) -> str:
        marks = self.has_intervals()
        head = (["#", "Trial", "Pre-training data", "Pre-training tasks", "Ratios", "Init",
                 "Seeds", "Meta-Sum"] + (["vs best"] if marks else [])
                + [label for _, label in PARTS] + ["Steps", "Status"])
        lines = [_md_row(head), _md_row(["---:" if h in _NUMERIC else "---" for h in head])]
        for i, r in enumerate(self.rows, 1):
            cells = [str(i), r.trial, r.data, r.tasks, r.ratios, r.init, str(r.seeds),
                     r.cell("meta_sum")] + ([r.verdict] if marks else [])
            cells += [r.cell(k) for k, _ in PARTS]
            cells += ["" if r.steps is None else f"{r.steps:,}", r.status()]
            lines.append(_md_row(cells))
        return "\n".join(lines) + "\n"

    def estimate_noise(self) -> None:
        """Each line's estimates and its verdict against the best line (see the module)."""
        done = [r for r in self.rows if _finite(r.meta_sum)]
        replicated = [r for r in done if len(r.seed_values.get("meta_sum", [])) >= 2]
        self.pooled_from = [f"{r.trial} {r.tasks} ({r.seeds} seeds)" for r in replicated]
        for key in KEYS:
            pooled = pooled_variance([r.seed_values.get(key, []) for r in replicated])
            if key == "meta_sum" and pooled is not None:
                self.pooled_df = pooled[1]
            for r in done:
                if r.seed_values.get(key):
                    r.est[key] = estimate(r.seed_values[key], pooled)
        if not done:
            return
        best = max(done, key=lambda r: r.est["meta_sum"].mean)
        for r in done:
            if r is best:
                r.verdict = "best"
                continue
            same = indistinguishable(r.est["meta_sum"], best.est["meta_sum"])
            r.p_vs_best = welch_p(r.est["meta_sum"], best.est["meta_sum"])
            r.verdict = "" if same is None else ("≈best" if same else "below")


_NUMERIC = {"#", "Seeds", "Meta-Sum", "Steps"} | {label for _, label in PARTS}


def _md_row(cells: list[str]) -> str:
    return "| " + " | ".join(c.replace("|", "/") for c in cells) + " |"


def _finite(v: float | None) -> bool:
    """Not None, NaN or ±inf; MLflow's SQL stores keep ±inf as ±the largest float, so that
    counts as infinite too."""
    return v is not None and math.isfinite(v) and abs(v) < sys.float_info.max


def sort_key(r: Row) -> tuple:
    """A search's order: by mean Meta-Sum, then the score so far (trials stopped early or
    running), and a line that failed on a non-finite score last."""
    bad = r.nonfinite or (r.meta_sum is not None and not _finite(r.meta_sum))
    meta = r.meta_sum if _finite(r.meta_sum) else None
    return (bad, meta is None, -(meta or 0.0), -(r.score if _finite(r.score) else 0.0),
            r.trial)


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
    # a twin's reused results are its original's, not a line of their own
    rows = [_row(t) for t in trials if "vlp.duplicate_of" not in t.data.tags]
    board = Leaderboard(parent.info.run_name, mode, parent_run_id, rows)
    board.estimate_noise()
    for r in rows:                            # the line's value is its mean
        if r.meta_sum is not None:
            r.meta_sum = r.est["meta_sum"].mean
    if mode.startswith("replay"):
        rows.sort(key=lambda r: r.trial)
    else:
        rows.sort(key=sort_key)
    return board


def _row(run: Any) -> Row:
    m, t = run.data.metrics, run.data.tags
    status = run.info.status
    state = t.get("vlp.state") or {"FINISHED": "completed", "FAILED": "failed",
                                   "KILLED": "stopped"}.get(status, "running")
    if state == "running" and status in ("FAILED", "KILLED"):   # closed by the driver
        state = "failed" if status == "FAILED" else "stopped"
    as_int = lambda k: int(m[k]) if k in m else None   # noqa: E731
    seeds = _seed_values(m)
    meta = m.get("meta_sum")
    error = t.get("vlp.error", "")
    bad = [v for v in ([meta] if meta is not None else []) + seeds.get("meta_sum", [])
           if not _finite(v)]
    if bad:        # a diverged model: a failed line, whatever its parts say
        state, meta = "failed", None
        shown = bad[0] if math.isnan(bad[0]) else math.copysign(math.inf, bad[0])
        error = f"Meta-Sum is {shown} (not finite)" + (f"; {error}" if error else "")
        seeds = {k: v for k, v in seeds.items() if all(map(_finite, v))}
        seeds.pop("meta_sum", None)
    score = m.get("score")
    return Row(trial=t.get("vlp.sweep.trial", run.info.run_name),
               data=t.get("pretraining_data", ""),
               tasks=t.get("mix", ""), ratios=t.get("mix_ratios", ""), init=t.get("init", ""),
               meta_sum=meta, scores={k: m.get(k) for k, _ in PARTS},
               score=score if _finite(score) else None,
               stage=as_int("stage"), stages=as_int("stages"),
               state=state, steps=as_int("trial_steps"), seconds=m.get("trial_seconds"),
               run_id=run.info.run_id, error=error,
               point_key=t.get("vlp.point_key", ""), seed_values=seeds, nonfinite=bool(bad),
               family=t.get("family", ""), protocol=t.get("downstream_protocol", ""))


def _seed_values(m: dict[str, float]) -> dict[str, list[float]]:
    """key → the replicates' values in seed order; a run without per-seed metrics (one
    seed, or logged before replicates existed) has its one value."""
    per: dict[str, dict[int, float]] = {}
    for k, v in m.items():
        hit = _SEED_KEY.match(k)
        if hit:
            per.setdefault(hit.group(2), {})[int(hit.group(1))] = v
    if per:
        return {k: [vals[s] for s in sorted(vals)] for k, vals in per.items()}
    return {k: [m[k]] for k in KEYS if k in m}


def _shown(uri: str) -> str:
    from vlp.contract.config_loader import redact

    return redact(uri)


def ranking_verdict(board: Leaderboard) -> list[str]:
    """What the ranking supports, in words: the best line, and the lines that its noise does
    not separate from it (or that there is no noise estimate to tell)."""
    best = board.best()
    if best is None:
        return []
    out = [f"best: {best.trial} {best.tasks} ({best.data}) Meta-Sum {best.cell('meta_sum')}"]
    done = [r for r in board.rows if r.meta_sum is not None and r is not best]
    if not done:
        return out
    if not board.has_intervals():
        out.append("with one seed per line this order is not evidence: the gaps may be seed "
                   "noise (set sweep.seeds, or sweep.include_seeds for a pooled estimate)")
        return out
    tied = [r for r in done if r.verdict == "≈best"]
    if tied:
        out.append(f"within noise of the best (not a real difference at this budget): "
                   + "; ".join(f"{r.trial} {r.tasks} {r.cell('meta_sum')}" for r in tied))
    else:
        out.append("every other line is below the best beyond its noise")
    return out
