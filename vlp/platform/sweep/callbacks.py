"""Driver-side Tune callback: progress lines, trial runs closed with the right status, and the
leaderboard on the parent run refreshed whenever a trial ends.

Progress, one line per event (Tune's own status tables are turned off)::

    [sweep] started t003 (3/8; 2 running): MLM+ITM+MRFR (2:1:1) · In-domain · init random
    [sweep] t003 stage 1/4 retrieval: ir 31.20 tr 35.50 → score 66.70 (1,240 steps, 95 s)
    [sweep] t003 stopped by ASHA after stage 2/4 (score 101.30)
    [sweep] t001 done: Meta-Sum 254.10 (2,960 steps, 410 s) | 3 done, 1 stopped, 0 failed of 8
"""

from __future__ import annotations

from typing import Any

import ray.tune

from vlp.platform.sweep.point import TrialPoint
from vlp.platform.tracking.leaderboard_view import OUTCOME_TAG
from vlp.benchmarks.meta_sum import metric_key, parts_of


def trial_name(config: dict[str, Any]) -> str:
    """The trial's name from its Tune config (see ``trial.trial_identity``)."""
    if "line" in config:
        return str(config["line"])
    return f"t{int(config['trial_number']) + 1:03d}"


class SweepProgress(ray.tune.Callback):
    def __init__(self, tracking_uri: str, parent_run_id: str, total: int,
                 lines: dict[str, dict[str, Any]] | None = None):
        self.tracking_uri = tracking_uri
        self.parent_run_id = parent_run_id
        self.total = total
        self.lines = lines or {}

    def say(self, text: str) -> None:      # a method, not a lambda: Tune pickles callbacks
        print(f"[sweep] {text}", flush=True)

    # ---- Tune events ----------------------------------------------------------------------

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info) -> None:
        name = trial_name(trial.config)
        point = self._point(trial.config)
        running = sum(t.status == "RUNNING" for t in trials)
        self.say(f"started {name} ({len(trials)}/{self.total}; {running} running): "
                 f"{point.describe()}")

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict,
                        **info) -> None:
        name = trial_name(trial.config)
        stage, stages = int(result.get("stage", 0)), int(result.get("stages", 0))
        cost = (f"{int(result.get('trial_steps', 0)):,} steps, "
                f"{result.get('trial_seconds', 0):.0f} s")
        if stage == 0:
            loss = result.get("pretrain_loss")
            what = f"pretraining loss {loss:.3f}" if loss is not None else "no pretraining"
            self.say(f"{name} stage 0/{stages} done: {what} ({cost})")
            return
        bench = result.get("benchmark", "")
        parts = " ".join(f"{k} {result[metric_key(k)]:.2f}" for k in _parts_of(bench)
                         if metric_key(k) in result)
        seeds = int(result.get("seeds", 1))
        mean = f" (mean of {seeds} seeds)" if seeds > 1 else ""
        self.say(f"{name} stage {stage}/{stages} {bench}: {parts} → score "
                 f"{result.get('score', 0):.2f}{mean} ({cost})")

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info) -> None:
        name = trial_name(trial.config)
        r = trial.last_result or {}
        stage, stages = r.get("stage"), r.get("stages")
        if stage is not None and stages is not None and stage < stages:
            self.say(f"{name} stopped by ASHA after stage {stage}/{stages} "
                     f"(score {r.get('score', 0):.2f})")
            # FINISHED, not KILLED: the MLflow UI draws KILLED as it draws FAILED (a red ✗);
            # the stop is the run's tags, shown in the leaderboard view's `outcome` column
            self._close(r, "FINISHED", {"vlp.state": "stopped", OUTCOME_TAG:
                                        f"stopped by ASHA after stage {stage}/{stages}"})
        else:
            self.say(f"{name} done: Meta-Sum {_fmt(r.get('meta_sum'))} "
                     f"(score {r.get('score', 0):.2f}; {int(r.get('trial_steps', 0)):,} steps, "
                     f"{r.get('trial_seconds', 0):.0f} s) | {self._tally(trials, trial)}")
            # the trial closes its run itself; this covers a trial killed right after
            self._close(r, "FINISHED", {"vlp.state": "completed", OUTCOME_TAG: "completed"})
        self._refresh()

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info) -> None:
        name = trial_name(trial.config)
        message = _first_line(getattr(trial, "error_message", None) or "")
        self.say(f"{name} FAILED (recorded; the sweep goes on): {message or 'see its error.txt'}"
                 f" | {self._tally(trials, trial)}")
        self._close(trial.last_result or {}, "FAILED",
                    {"vlp.state": "failed", OUTCOME_TAG: "failed",
                     **({"vlp.error": message[:500]} if message else {})})
        self._refresh()

    # ---- helpers --------------------------------------------------------------------------

    def _point(self, config: dict[str, Any]) -> TrialPoint:
        if "line" in config:
            return TrialPoint.from_params(self.lines[config["line"]])
        return TrialPoint.from_params(config.get("point", {}))

    def _close(self, result: dict, status: str, tags: dict[str, str]) -> None:
        run_id = result.get("mlflow_run_id")
        if not run_id:
            return
        from vlp.platform.sweep.tracking import close_trial_run

        try:
            close_trial_run(self.tracking_uri, run_id, status, tags)
        except Exception as e:   # the sweep goes on; the leaderboard shows the run as running
            self.say(f"warning: could not close MLflow run {run_id}: {e}")

    def _refresh(self) -> None:
        from vlp.platform.tracking.leaderboard import load_leaderboard
        from vlp.platform.tracking.leaderboard_export import log_leaderboard

        try:
            log_leaderboard(self.tracking_uri, load_leaderboard(self.tracking_uri,
                                                                self.parent_run_id))
        except Exception as e:
            self.say(f"warning: leaderboard not updated in MLflow: {type(e).__name__}: {e}")

    def _tally(self, trials: list, ending: Any) -> str:
        """Counts with ``ending`` as ended (Tune updates its status after the callbacks)."""
        ended = [t for t in trials if t is ending or t.status in ("TERMINATED", "ERROR")]
        failed = sum(t.status == "ERROR" for t in ended if t is not ending)
        running = sum(t.status == "RUNNING" for t in trials if t is not ending)
        return (f"{len(ended)} of {self.total} ended ({failed} failed before), "
                f"{running} running")


def _parts_of(benchmark: str) -> list[str]:
    return [p.name for p in parts_of(benchmark)]


def _fmt(v: Any) -> str:
    return f"{v:.2f}" if isinstance(v, (int, float)) else "–"


def _first_line(text: str) -> str:
    lines = [l.strip() for l in str(text).splitlines() if l.strip()]
    # Tune's error text ends with the exception line; that is the cause
    return lines[-1] if lines else ""
