"""What rank 0 of the training loop writes to MLflow: one run per job, found again after a
worker restart (by the run id in the checkpoint, else by the job's deterministic key), params
= the job's flattened config (the tracking spec carries it), metrics as window means (one row
per metric every ``metric_window`` steps: a 500k-step run logs 50k rows per metric, not 500k),
and artifacts (config, DeepSpeed config, loss curve, a pointer to the final checkpoint).

Every step's record goes to the run's storage as Parquet (``step_log``), MLflow or not; the
loss curve is drawn from it, so closing the run reads nothing back from MLflow.

Every write goes through a ``TrackingQueue``: the training thread only queues it, so a slow
or dead tracking server never blocks a step. MLflow's HTTP client gets short timeouts and few
retries here (``MLFLOW_HTTP_REQUEST_*``, unless the environment sets them). What could not be
delivered by the end is kept in the run's storage (``tracking-undelivered.jsonl`` in the run
folder) and reported.
"""

from __future__ import annotations

import json
import os
from typing import Any

from vlp.platform.training.checkpointing import TrainerState
from vlp.platform.training.loop_config import LoopConfig
from vlp.platform.tracking.mlflow_run import MlflowRun, loss_curve_figure
from vlp.platform.tracking.background_queue import TrackingQueue
from vlp.platform.tracking.step_log import StepLog, read_steps

_MAX_PENDING_ROWS = 100_000
_NOT_METRICS = ("step", "stage", "tasks")
UNDELIVERED_FILE = "tracking-undelivered.jsonl"
# MLflow's defaults (120 s timeout, 7 retries with backoff) hold one call for many minutes
HTTP_DEFAULTS = {"MLFLOW_HTTP_REQUEST_TIMEOUT": "10", "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
                 "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1"}
QUEUE_LIMIT = 256            # queued writes (one per report) before the oldest is given up
CLOSE_TIMEOUT_S = 60.0       # how long the end of training waits for the queue to empty
METRIC_WINDOW = 10           # steps per MLflow row: 500k steps → 50k rows per metric


class RankZeroTracker:
    def __init__(self, spec: dict[str, Any], cfg: LoopConfig):
        self.spec = spec
        self.cfg = cfg
        self.run: MlflowRun | None = None
        self.pending: list[tuple[int, dict[str, float]]] = []
        self.window_steps = int(spec.get("metric_window") or METRIC_WINDOW)
        self._sums: dict[str, float] = {}
        self._counts: dict[str, int] = {}
        self._window_last = 0
        self.last_checkpoint: str | None = None
        self.queue: TrackingQueue | None = None
        self.undelivered: list[dict[str, Any]] = []
        self.steps = _step_log(spec)
        if self.enabled:
            for k, v in HTTP_DEFAULTS.items():
                os.environ.setdefault(k, v)
            self.queue = TrackingQueue(int(spec.get("queue_limit", QUEUE_LIMIT)))

    @property
    def enabled(self) -> bool:
        return bool(self.spec.get("enabled"))

    @property
    def run_id(self) -> str | None:
        return self.run.run_id if self.run else None

    def open(self, run_id: str | None, fresh: bool, start_step: int = 0) -> str | None:
        """Queue the run's opening (params, config artifacts); returns at once with the run
        id known so far (``run_id``; ``self.run_id`` once the server answered). The step log
        rewinds to ``start_step`` (the checkpoint resumed from)."""
        if self.steps is not None:
            self.steps.resume_at(start_step)
        if not self.enabled:
            return None
        s = self.spec

        def write():
            self.run = MlflowRun.open(
                s["tracking_uri"], s["experiment"], run_name=s["run_name"], run_id=run_id,
                key=s["key"], parent_run_id=s.get("parent_run_id"),
                artifact_location=s.get("artifact_location"),
                tags=s["tags"])
            changed = self.run.log_params(s["params"])
            if changed:
                print(f"[vlp pretrain] resumed with changed settings (kept the first values as "
                      f"params, see tag vlp.changed_on_resume): {', '.join(changed)}", flush=True)
            if fresh:
                self.run.log_text(s["config_text"], "config/experiment.yaml")
                self.run.log_dict(s["deepspeed_config"], "config/deepspeed.json")
            self.run.set_tags({"vlp.state": "running"})
        self.queue.submit(write, {"kind": "open", "run_name": s["run_name"], "key": s["key"],
                                  "params": s["params"]})
        return run_id

    def log_derived(self, figures: dict[str, Any]) -> None:
        if self.enabled:
            params = {f"derived.{k}": str(v) for k, v in figures.items()}
            self._submit(lambda run: run.log_params(params), {"kind": "params", "params": params})

    def add_step(self, record: dict[str, Any]) -> None:
        if self.steps is not None:
            self.steps.add(record)
        if not self.enabled:
            return
        step = int(record["step"])
        for k, v in record.items():
            if k not in _NOT_METRICS and isinstance(v, (int, float)):
                self._sums[k] = self._sums.get(k, 0.0) + float(v)
                self._counts[k] = self._counts.get(k, 0) + 1
        self._window_last = step
        if step % self.window_steps == 0:
            self._end_window()

    def _end_window(self) -> None:
        """The window's mean of each metric, as one row at its last step (a task's loss over
        the steps that drew it)."""
        if self._counts:
            self.pending.append((self._window_last, {k: self._sums[k] / n
                                                     for k, n in self._counts.items()}))
            del self.pending[:-_MAX_PENDING_ROWS]
        self._sums, self._counts = {}, {}

    def flush(self, window_metrics: dict[str, Any], step: int,
              checkpoint: str | None = None) -> None:
        if self.steps is not None:
            self.steps.flush(force=checkpoint is not None)
        if not self.enabled:
            return
        extra = {k: float(window_metrics[k]) for k in ("examples_per_s", "input_units_per_s",
                                                        "examples_seen", "skipped_batches",
                                                        "data_wait_share", "model_tflops_per_s",
                                                        "mfu")
                 if k in window_metrics}   # mfu only where the device's peak is known
        rows = self.pending + [(step, extra)]
        self.pending = []
        tags = {"vlp.checkpoint": checkpoint, "vlp.checkpoint_step": step} if checkpoint else {}

        stamp = _now_ms()       # at queue time: a retried write is the same rows again

        def write(run):
            run.log_metric_rows(rows, stamp)
            if tags:
                run.set_tags(tags)
        self._submit(write, {"kind": "metrics", "rows": rows, "tags": tags})
        if checkpoint:
            self.last_checkpoint = checkpoint

    def flush_quietly(self) -> None:
        """At the end (or a failure): the step log written, the last (partial) window's
        means and what is pending queued."""
        if self.steps is not None:
            self.steps.flush()
        if not self.enabled:
            return
        self._end_window()
        if self.pending:
            rows, self.pending = self.pending, []
            stamp = _now_ms()
            self._submit(lambda run: run.log_metric_rows(rows, stamp),
                         {"kind": "metrics", "rows": rows})

    def close(self, completed: bool, state: TrainerState,
              timeout_s: float | None = None) -> list[dict[str, Any]]:
        """Queue the closing writes, wait for the queue (``timeout_s``, default
        ``spec["close_timeout_s"]`` or ``CLOSE_TIMEOUT_S``), keep what was not delivered in
        the run's storage and say so. Returns the undelivered records."""
        self.flush_quietly()
        if not self.enabled:
            self._say_steps_unwritten()
            return []
        curves = self.loss_curves()
        pointer = {"checkpoint": self.last_checkpoint, "step": state.step,
                   "completed": completed, "examples_seen": state.examples_seen,
                   "note": "Ray Train checkpoint folder holding the DeepSpeed checkpoint"}

        def write(run):
            if curves:
                run.log_figure(loss_curve_figure(curves, title=self.cfg.name),
                               "plots/loss_curve.png")
            run.log_text(json.dumps(pointer, indent=1), "checkpoint/latest.json")
            run.set_tags({"vlp.state": "completed" if completed else "stopped"})
            # KILLED = stopped on purpose (train.stop_after); re-running resumes this run
            run.finish("FINISHED" if completed else "KILLED")
        self._submit(write, {"kind": "close", "pointer": pointer,
                             "status": "FINISHED" if completed else "KILLED"})
        wait = timeout_s if timeout_s is not None else float(
            self.spec.get("close_timeout_s", CLOSE_TIMEOUT_S))
        self.undelivered = self.queue.close(wait)
        if self.undelivered:
            self._keep_undelivered()
        self._say_steps_unwritten()
        return self.undelivered

    def loss_curves(self) -> dict[str, list[tuple[int, float]]]:
        """The run's total and per-task losses, step by step, from its step log (the steps of
        earlier attempts included); {} where it has none."""
        if self.steps is None or self.steps.rows:
            return {}
        try:
            frame = read_steps(self.steps.storage, self.steps.run_name)
        except Exception as e:   # a plot is not worth failing the end of training for
            print(f"[vlp pretrain] warning: no loss curve: the step log could not be read "
                  f"({type(e).__name__}: {e})", flush=True)
            return {}
        keys = [k for k in frame.columns if k == "loss" or k.endswith("_loss")]
        return {k: [(int(s), float(v)) for s, v in zip(frame["step"], frame[k]) if v == v]
                for k in keys}

    def _say_steps_unwritten(self) -> None:
        if self.steps is not None and self.steps.rows:
            print(f"[vlp pretrain] warning: {len(self.steps.rows)} step record(s) could not be "
                  f"written to the step log ({self.steps.error})", flush=True)

    def _submit(self, fn, record: dict[str, Any]) -> None:
        """``fn(run)`` once the run is open (a failed opening fails it too, so it is kept)."""
        def call():
            if self.run is None:
                raise RuntimeError("the MLflow run could not be opened")
            fn(self.run)
        self.queue.submit(call, record)

    def _keep_undelivered(self) -> None:
        from vlp.platform.cluster.run_storage import open_location

        n = len(self.undelivered)
        why = "; ".join(self.queue.errors[:2]) or "the tracking server did not answer in time"
        where = "nowhere (no run storage)"
        try:
            if self.spec.get("storage"):
                storage = open_location(self.spec["storage"])
                lines = "".join(json.dumps(r, default=str) + "\n" for r in self.undelivered)
                storage.write_text(lines, self.spec["run_name"], UNDELIVERED_FILE)
                where = storage.uri(self.spec["run_name"], UNDELIVERED_FILE)
        except Exception as e:  # report it; training is done either way
            where = f"nowhere ({type(e).__name__}: {e})"
        print(f"[vlp pretrain] warning: {n} MLflow write(s) could not be delivered ({why}); "
              f"kept in {where}", flush=True)


def _now_ms() -> int:
    import time

    return int(time.time() * 1000)


def _step_log(spec: dict[str, Any]) -> StepLog | None:
    """The run's step log in its storage; None where the spec names no storage."""
    if not spec.get("storage") or not spec.get("run_name"):
        return None
    from vlp.platform.cluster.run_storage import open_location

    return StepLog(open_location(spec["storage"]), spec["run_name"])
