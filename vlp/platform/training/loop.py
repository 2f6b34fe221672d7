"""The per-worker training loop that Ray Train runs on every worker (pretraining and
finetuning alike: it reads a ``LoopConfig`` only).

Per optimizer step: ``grad_accum`` micro-batches, each of one task drawn by the seeded task
sampler (the same draw on every rank: UNITER's conditional masking serves one task per batch),
or under ``train.objective: summed`` each with every task's loss on one example set
(``objective.py``: one backward per micro-batch either way). The micro-batches are built ahead
on a thread or in a process of their own (``prefetch.Prefetcher``) while the device computes.
One all-reduce per optimizer step, after the last backward and before the update, carries the
step's statistics: per micro-batch a non-finite-loss flag and the task (or task set) drawn (so
ranks that drew differently are caught), examples, input units and the outputs' sums; nothing
in a micro-batch waits on the device. A non-finite loss raises before the update; where the
optimizer skips a non-finite update on the device (bf16 under ZeRO-1: ``device_step.py``)
nothing in the step waits: the statistics are read ``STATS_LAG`` steps late
(``pending_stats.py``) and the loop raises then, the update never applied. With
``on_nonfinite: skip`` a small all-reduce before each backward decides instead whether to drop
that micro-batch on every rank and draw another (a dropped batch must not reach the gradients).
An fp16 step that DeepSpeed skips for overflow does not count as a step: the step counter, the
schedule and the stage boundaries do not move. Reports to Ray go through a thread
(``reporter.Reporter``): the step does not wait for Ray's controller to collect a metrics
report; a checkpoint report is waited for. Checkpoints carry the trainer state (step, examples
seen, sampler, batch source, RNG), so a resumed run continues exactly.
"""

from __future__ import annotations

import posixpath
import time
from typing import Any

import torch
import torch.distributed as dist

from vlp.platform.training import checkpointing, objective
from vlp.platform.training.checkpointing import TrainerState
from vlp.platform.training.device_step import uses_device_step
from vlp.platform.training.failures import setup_phase
from vlp.platform.training.gpu_placement import set_allocator
from vlp.platform.training.loop_config import LoopConfig
from vlp.platform.training.pending_stats import PendingStats
from vlp.platform.training.reporter import Reporter
from vlp.platform.training.run_banner import announce, announce_measured
from vlp.platform.training.step_records import complete_record, read_late
from vlp.platform.training.step_stats import (ReportWindow, check_tasks, nonfinite_flag,
                                              reduce_step, step_clock, step_vector)
from vlp.platform.training.worker_setup import WorkerSetup

# steps between a step and the read of its statistics where the optimizer skips a non-finite
# step on the device (``device_step.py``): the host then never waits for the device
STATS_LAG = 2


def train_loop_per_worker(loop_config: dict[str, Any]) -> dict[str, Any]:
    """Entry point for ``TorchTrainer``. ``loop_config``: ``config`` (a ``LoopConfig``, paths
    already absolute), ``components`` (a ``protocols.Components``), ``tracking``
    (``launch.tracking_spec``) and ``run_dir`` (the Ray run folder); optionally ``context``
    (a ``worker_context.WorkerContext``; Ray Train's when absent — the local runner passes
    its own)."""
    with setup_phase("worker set-up"):      # an error here is not worth a retry
        cfg = loop_config["config"]
        if not isinstance(cfg, LoopConfig):
            raise TypeError(f"train_loop_config['config'] is a {type(cfg).__name__}, expected "
                            f"a LoopConfig (launch.run_loop builds it)")
        # before CUDA's allocator starts (ray_session.worker_env sets it for Ray's workers too)
        set_allocator()
        worker = _Worker(cfg, loop_config)
    return worker.run()


class _Worker(WorkerSetup):
    # step_clock() at the end of the last step's record (None: no step yet)
    _step_end: tuple[float, float] | None = None
    # the statistics of the steps not yet read (a device-step optimizer: read STATS_LAG late)
    pending: PendingStats | None = None

    # ---- the loop -------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        t0 = time.perf_counter()
        # model + initial weights, engine, checkpoint, batch source: a deterministic error
        # (config, data, checkpoint) ends the run at once; faults are retried
        with setup_phase(f"rank {self.rank} set-up"):
            state = self._setup()
        t1 = time.perf_counter()
        start_step = state.step
        if self.tracker:
            state.mlflow_run_id = self.tracker.open(state.mlflow_run_id, fresh=state.step == 0,
                                                    start_step=state.step)
            self._announce(fresh=state.step == 0)
        self._say(f"set-up {t1 - t0:.1f} s (model, engine, checkpoint), tracking "
                  f"{time.perf_counter() - t1:.1f} s")
        self._check_interconnect()
        window = ReportWindow(self.peak, self.world)
        self.reporter = Reporter(self.context.report)
        self._step_end = step_clock()
        ok = False
        try:
            while state.step < self.stop_at:
                if state.step == self.stage_ends[state.stage]:
                    self._next_stage(state)
                # none for an fp16 overflow (DeepSpeed skipped the update) and for the steps
                # whose statistics are still on their way (read a few steps late)
                for record in self._step(state):
                    self._take(record, window, start_step)
                self._maybe_report(state, window, start_step)
            for record in self._read_pending(state, drain=True):
                self._take(record, window, start_step)
            self.reporter.drain()
            ok = True
        except BaseException:
            if self.tracker:
                self.tracker.flush_quietly()
            raise
        finally:
            # after a failure, a report stuck in Ray's cross-rank sync must not hold the exit
            self.reporter.close(None if ok else 30.0)
            self._close_source()
        completed = state.step >= self.total
        after = self._after_training() if completed else None
        if self.tracker:
            self.tracker.close(completed, state)
            state.mlflow_run_id = self.tracker.run_id or state.mlflow_run_id
        return {"history": list(self.history), "start_step": start_step,
                "final_step": state.step, "total_steps": self.total, "completed": completed,
                "examples_seen": state.examples_seen, "input_units_seen": state.input_units_seen,
                "skipped_batches": state.skipped_batches, "mlflow_run_id": state.mlflow_run_id,
                "checkpoint_path": posixpath.join(self.run_dir, _checkpoint_dir_name(state.step)),
                "parameters": self.n_params, "after_training": after}

    def _after_training(self) -> Any:
        """The optional ``Components.after_training`` hook, on every rank (finetuning
        evaluates there: queries sharded over the workers, gathered on rank 0); rank 0's
        result reaches the driver in the return value."""
        hook = getattr(self.components, "after_training", None)
        return None if hook is None else hook(self.cfg, self.engine.module, self.info)

    def _take(self, record: dict[str, Any], window: ReportWindow, start_step: int) -> None:
        window.add(record)
        self.history.append(record)
        if self.tracker:
            self.tracker.add_step(record)
            if record["step"] == 1 and start_step == 0:
                self._announce_measured(record)

    def _optimizer_step(self, state: TrainerState) -> dict[str, Any] | None:
        """One optimizer step; the last record it completes (this step's, unless the
        statistics are read late), or None when there is none (an fp16 overflow: the step
        does not count)."""
        records = self._step(state)
        return records[-1] if records else None

    def _stats_lag(self) -> int:
        """Steps between a step and the read of its statistics: ``STATS_LAG`` where the
        optimizer skips a non-finite step on the device, else 0 (the loop reads them before
        the update, so that a non-finite loss never reaches the weights)."""
        return STATS_LAG if uses_device_step(getattr(self.engine, "optimizer", None)) else 0

    def _step(self, state: TrainerState) -> list[dict[str, Any]]:
        """``grad_accum`` micro-batches and the update; the records of the steps whose
        statistics were read (this step's at once, or an earlier one's: ``_stats_lag``)."""
        lag = self._stats_lag()
        if self.pending is None or self.pending.lag != lag:
            if self.pending is not None:
                self.pending.drain()
            self.pending = PendingStats(lag)
        gas, cfg = self.cfg.train.grad_accum, self.cfg.train
        start = step_clock()
        lr = float(self.engine.get_lr()[0])
        wait0 = self.prefetch.wait_s
        needed = self._micro_batches_left(state)
        done, skips, micro, passes = 0, 0, [], 0.0
        while self.graphs is not None and done < gas:    # one whole step, graphed
            item = self.prefetch.next(needed - 1)
            # copied: the graph's outputs are overwritten by its next replay
            out = {k: v.clone() for k, v in self.graphs(item.task, item.batch).items()}
            micro.append((item.task, out, item.examples, item.input_units,
                          item.real_units * item.passes))
            passes, done = item.passes, 1
            vec, keys = step_vector(micro, self.task_ids)
            dist.all_reduce(vec)
        while done < gas:
            item = self.prefetch.next(needed - done - 1)
            task = item.task
            out = objective.forward(self.engine, item.batch, task)
            if cfg.on_nonfinite == "skip" and not self._finite_everywhere(task, out, state):
                state.skipped_batches += 1
                skips += 1
                msg = (f"non-finite loss at step {state.step + 1}, micro-batch {done + 1}/{gas}, "
                       f"task {task!r} (rank {self.rank} local values "
                       f"{ {k: float(v) for k, v in out.items()} })")
                if skips > cfg.max_nonfinite_skips:
                    raise FloatingPointError(f"{msg}; {skips} non-finite batches dropped in this "
                                             f"step (train.max_nonfinite_skips="
                                             f"{cfg.max_nonfinite_skips})")
                self._say(msg + ": batch dropped on every rank")
                continue
            self.engine.backward(out["loss"])
            micro.append((task, {k: v.detach() for k, v in out.items()}, item.examples,
                          item.input_units, item.real_units * item.passes))
            passes += item.passes
            done += 1
            if done == gas:   # before the update: a non-finite loss must not reach the weights
                if lag == 0:
                    stats = self._reduce_step(micro, state)
                else:         # the optimizer skips the update on the device instead
                    vec, keys = step_vector(micro, self.task_ids)
                    dist.all_reduce(vec)
                    self.engine.optimizer.skip_if(nonfinite_flag(vec, len(micro)))
            self.engine.step()
        if lag == 0:
            state.examples_seen += stats["examples"]
            state.input_units_seen += stats["input_units"]
            if not self.engine.was_step_applied():
                self.overflow_skips += 1
                self._say(f"step {state.step + 1}: gradient overflow, update skipped (loss "
                          f"scale lowered; {self.overflow_skips} skipped so far); the step is "
                          f"redone")
                return []
        state.step += 1
        record = {"step": state.step, "stage": state.stage, "tasks": [m[0] for m in micro],
                  "lr": lr, "data_wait_s": self.prefetch.wait_s - wait0}
        # since the last step's record: this step and the bookkeeping after the last one
        now, since = step_clock(), self._step_end or start
        record["step_time_s"], record["process_cpu_s"] = now[0] - since[0], now[1] - since[1]
        self._step_end = now
        if lag == 0:
            return [self._complete(record, stats, passes)]
        opt = self.engine.optimizer
        after = torch.stack([opt._global_grad_norm.reshape(()).double(),
                             opt.found_inf.reshape(()).double()])
        self.pending.push(torch.cat([vec, after]), (record, micro, keys, passes))
        return self._read_pending(state)

    def _read_pending(self, state: TrainerState, drain: bool = False) -> list[dict[str, Any]]:
        """The records of the steps whose statistics have come (all of them: ``drain``)."""
        if self.pending is None:
            return []
        out = []
        for record, stats, passes, skipped in read_late(self.pending, world=self.world,
                                                        rank=self.rank, read_at=state.step,
                                                        drain=drain):
            state.examples_seen += stats["examples"]
            state.input_units_seen += stats["input_units"]
            if skipped:   # its schedule step undone: the update did not happen
                self.engine.optimizer.read_skip(self.engine.lr_scheduler)
                self.overflow_skips += 1
                self._say(f"step {record['step']}: non-finite gradient norm, update skipped "
                          f"on the device ({self.overflow_skips} skipped so far)")
            out.append(self._complete(record, stats, passes))
        return out

    def _complete(self, record: dict[str, Any], stats: dict[str, Any],
                  passes: float) -> dict[str, Any]:
        return complete_record(record, stats, passes, self.cfg.train.grad_accum, self.shape)

    def _micro_batches_left(self, state: TrainerState) -> int:
        """Micro-batches this stage still needs if none is dropped (the prefetch bound)."""
        end = min(self.stage_ends[state.stage], self.stop_at)
        return max(1, (end - state.step) * self.cfg.train.grad_accum)

    def _finite_everywhere(self, task: str, out: dict[str, torch.Tensor],
                           state: TrainerState) -> bool:
        """``on_nonfinite: skip``: one small all-reduce before the backward: whether every
        rank's ``*loss`` is finite (and that every rank drew the same task)."""
        losses = torch.stack([v.detach().float().reshape(()) for k, v in out.items()
                              if k.endswith("loss")])
        idx = float(objective.task_id(task, self.task_ids))
        head = torch.stack([(~torch.isfinite(losses)).any().double(),
                            torch.tensor(idx, dtype=torch.float64, device=losses.device),
                            torch.tensor(idx * idx, dtype=torch.float64, device=losses.device)])
        dist.all_reduce(head)
        h = head.tolist()
        self._check_tasks([task], [h[1]], [h[2]], state)
        return h[0] == 0

    def _reduce_step(self, micro: list[tuple[str, dict[str, torch.Tensor], int, int]],
                     state: TrainerState) -> dict[str, Any]:
        return reduce_step(micro, self.task_ids, self.world, self.rank, state.step)

    def _check_tasks(self, tasks: list[str], id_sum: list[float], id_sq: list[float],
                     state: TrainerState) -> None:
        check_tasks(tasks, id_sum, id_sq, self.world, self.rank, state.step)

    # ---- reporting, checkpoints -------------------------------------------------------------

    def _maybe_report(self, state: TrainerState, window: ReportWindow,
                      start_step: int = 0) -> None:
        step = state.step
        at_stage_end = step in self.stage_ends
        save = step % self.cfg.checkpoint_interval == 0 or step == self.stop_at or at_stage_end
        if not save and step % self.cfg.train.log_every:
            return
        if save:   # a checkpoint holds every step's statistics (examples seen): none pending
            for record in self._read_pending(state, drain=True):
                self._take(record, window, start_step)
        metrics = window.summary(state)
        window.reset()
        if not save:
            if self.tracker:
                self.tracker.flush(metrics, step)
            self.reporter.submit(metrics)      # Ray's report on its thread: no wait here
            return
        # the states before the first batch the prefetch thread built but the loop did not use
        resume = self.prefetch.state_dict()
        state.sampler = resume["sampler"]
        if self.tracker and self.tracker.run_id:   # known once the tracking queue opened it
            state.mlflow_run_id = self.tracker.run_id
        name = _checkpoint_dir_name(step)
        checkpointing.save_reported(self.engine, state, self.rank, resume["source"],
                                    self.cfg.stage_steps(), self.reporter, metrics, name)
        if self.tracker:
            self.tracker.flush(metrics, step, checkpoint=posixpath.join(self.run_dir, name))

    def _announce(self, fresh: bool) -> None:
        announce(self.cfg, self.tracker, self._say, fresh, world=self.world,
                 n_params=self.n_params, n_trainable=self.n_trainable, total=self.total,
                 task_names=list(self.task_ids), precision=self.precision,
                 device=self.info.device, peak=self.peak)

    def _check_interconnect(self) -> None:
        """Every rank: one all-reduce timed (train.interconnect_check); rank 0 says it."""
        from vlp.platform.cluster.bus_bandwidth import start_of_run

        t = self.cfg.train
        start_of_run(t.interconnect_check, t.interconnect_mb, use_gpu=self.cfg.scaling.use_gpu,
                     world=self.world, rank=self.rank, device=self.info.device, say=self._say)

    def _announce_measured(self, record: dict[str, Any]) -> None:
        announce_measured(record, self.tracker, self._say)


def _checkpoint_dir_name(step: int) -> str:
    return f"checkpoint_{checkpointing.step_tag(step)}"
