"""What rank 0 of the pretraining loop writes to MLflow: one run per job, found again after a
worker restart (by the run id in the checkpoint, else by the job's deterministic key), params
= the flattened config, per-step metrics in batches, and artifacts (config, DeepSpeed config,
loss curve, a pointer to the final checkpoint).

A tracking failure after the run is open never stops training: metrics are kept and retried
at the next flush, and a warning is printed.
"""

from __future__ import annotations

import json
from typing import Any

from vlp.platform.checkpointing import TrainerState
from vlp.platform.config_loader import flatten, to_yaml
from vlp.platform.experiment_config import ExperimentConfig
from vlp.platform.tracking import MlflowRun, loss_curve_figure

_MAX_PENDING_ROWS = 100_000
_NOT_METRICS = ("step", "stage", "tasks")


class RankZeroTracker:
    def __init__(self, spec: dict[str, Any], cfg: ExperimentConfig):
        self.spec = spec
        self.cfg = cfg
        self.run: MlflowRun | None = None
        self.pending: list[tuple[int, dict[str, float]]] = []
        self.last_checkpoint: str | None = None
        self._warned = False

    @property
    def enabled(self) -> bool:
        return bool(self.spec.get("enabled"))

    def open(self, run_id: str | None, fresh: bool) -> str | None:
        if not self.enabled:
            return None
        s = self.spec
        self.run = MlflowRun.open(s["tracking_uri"], s["experiment"], run_name=s["run_name"],
                                  run_id=run_id, key=s["key"], parent_run_id=s.get("parent_run_id"),
                                  artifact_location=s.get("artifact_location"),
                                  tags={"vlp.job": "pretrain", "vlp.model_family":
                                        self.cfg.model.family})
        changed = self.run.log_params(flatten(self.cfg))
        if changed:
            print(f"[vlp pretrain] resumed with changed settings (kept the first values as "
                  f"params, see tag vlp.changed_on_resume): {', '.join(changed)}", flush=True)
        if fresh:
            self.run.log_text(to_yaml(self.cfg), "config/experiment.yaml")
            self.run.log_dict(s["deepspeed_config"], "config/deepspeed.json")
        self.run.set_tags({"vlp.state": "running"})
        return self.run.run_id

    def log_derived(self, figures: dict[str, Any]) -> None:
        if self.run:
            self._guard(lambda: self.run.log_params({f"derived.{k}": str(v)
                                                     for k, v in figures.items()}))

    def add_step(self, record: dict[str, Any]) -> None:
        if not self.run:
            return
        row = {k: float(v) for k, v in record.items()
               if k not in _NOT_METRICS and isinstance(v, (int, float))}
        self.pending.append((record["step"], row))
        del self.pending[:-_MAX_PENDING_ROWS]

    def flush(self, window_metrics: dict[str, Any], step: int,
              checkpoint: str | None = None) -> None:
        if not self.run:
            return
        extra = {k: float(window_metrics[k]) for k in ("examples_per_s", "input_units_per_s",
                                                        "examples_seen", "skipped_batches",
                                                        "data_wait_share", "model_tflops_per_s",
                                                        "mfu")
                 if k in window_metrics}   # mfu only where the device's peak is known
        rows = self.pending + [(step, extra)]

        def write():
            self.run.log_metric_rows(rows)
            if checkpoint:
                self.run.set_tags({"vlp.checkpoint": checkpoint, "vlp.checkpoint_step": step})
        if self._guard(write):
            self.pending = []
        if checkpoint:
            self.last_checkpoint = checkpoint

    def flush_quietly(self) -> None:
        if self.run and self.pending:
            self._guard(lambda: self.run.log_metric_rows(self.pending))

    def close(self, completed: bool, state: TrainerState) -> None:
        if not self.run:
            return

        def write():
            if self.pending:
                self.run.log_metric_rows(self.pending)
                self.pending = []
            keys = ["loss"] + [f"{t}_loss" for t in sorted({t for s in self.cfg.stage_plan()
                                                              for t in s.tasks})]
            curves = {k: self.run.metric_history(k) for k in keys}
            fig = loss_curve_figure({k: v for k, v in curves.items() if v},
                                    title=self.cfg.run.name)
            self.run.log_figure(fig, "plots/loss_curve.png")
            pointer = {"checkpoint": self.last_checkpoint, "step": state.step,
                       "completed": completed, "examples_seen": state.examples_seen,
                       "note": "Ray Train checkpoint folder holding the DeepSpeed checkpoint"}
            self.run.log_text(json.dumps(pointer, indent=1), "checkpoint/latest.json")
            self.run.set_tags({"vlp.state": "completed" if completed else "stopped"})
            # KILLED = stopped on purpose (train.stop_after); re-running resumes this run
            self.run.finish("FINISHED" if completed else "KILLED")
        self._guard(write)

    def _guard(self, fn) -> bool:
        try:
            fn()
            return True
        except Exception as e:  # tracking must not kill a long training run
            if not self._warned:
                print(f"[vlp pretrain] warning: MLflow logging failed ({type(e).__name__}: {e}); "
                      f"training goes on, metrics are retried at the next flush", flush=True)
                self._warned = True
            return False
