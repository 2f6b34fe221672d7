"""The per-worker pretraining loop that Ray Train runs on every worker.

Per optimizer step: ``grad_accum`` micro-batches, each of one task drawn by the seeded task
sampler (the same draw on every rank: UNITER's conditional masking serves one task per
batch). Before each backward, one all-reduce checks across ranks that the loss is finite and
that every rank drew the same task; a non-finite loss raises, or (``on_nonfinite: skip``)
drops that micro-batch on every rank and draws another. Checkpoints carry the trainer state
(step, examples seen, sampler, batch source, RNG), so a resumed run continues exactly.
"""

from __future__ import annotations

import collections
import math
import posixpath
import tempfile
import time
from typing import Any

import torch
import torch.distributed as dist

from vlp.platform import checkpointing
from vlp.platform.checkpointing import TrainerState
from vlp.platform.config_loader import from_dict
from vlp.platform.engine import build_engine, compute_dtype, use_extensions_dir
from vlp.platform.experiment_config import ExperimentConfig
from vlp.platform.failures import SetupError, setup_phase
from vlp.platform.protocols import WorkerInfo
from vlp.platform.run_tracking import RankZeroTracker

HISTORY_LIMIT = 10_000          # per-step records kept for the return value (MLflow has all)
NUM_EXAMPLES, INPUT_UNITS = "num_examples", "input_units"   # vlp/datasets/batch_spec.py
# per-step record fields that are not model outputs (the rest: "loss", "mlm_loss", "mlm_acc")
BOOKKEEPING = frozenset({"step", "stage", "tasks", "lr", "global_batch_examples",
                         "global_batch_input_units"})


def train_loop_per_worker(loop_config: dict[str, Any]) -> dict[str, Any]:
    """Entry point for ``TorchTrainer``. ``loop_config``: ``config`` (the experiment config
    as a dict, paths already absolute), ``components`` (a ``protocols.Components``),
    ``tracking`` (``pretrain.tracking_spec``) and ``run_dir`` (the Ray run folder)."""
    with setup_phase("worker set-up"):      # an error here is not worth a retry
        cfg = from_dict(ExperimentConfig, loop_config["config"])
        worker = _Worker(cfg, loop_config)
    return worker.run()


class _Worker:
    def __init__(self, cfg: ExperimentConfig, loop_config: dict[str, Any]):
        import ray.train
        import ray.train.torch

        self.cfg = cfg
        self.components = loop_config["components"]
        self.run_dir = loop_config["run_dir"]
        ctx = ray.train.get_context()
        self.rank, self.world = ctx.get_world_rank(), ctx.get_world_size()
        device = ray.train.torch.get_device() if cfg.scaling.use_gpu else torch.device("cpu")
        self.info = WorkerInfo(self.rank, self.world, ctx.get_local_rank(), device, cfg.run.seed)
        self.dtype = compute_dtype(cfg)
        self.plan = cfg.stage_plan()
        self.stage_ends = [sum(s.steps for s in self.plan[:i + 1]) for i in range(len(self.plan))]
        self.total = self.stage_ends[-1]
        self.stop_at = min(self.total, cfg.train.stop_after or self.total)
        # tasks with a positive ratio in some stage: the model's heads, and the ids that the
        # cross-rank check compares
        self.task_ids = {t: i for i, t in enumerate(cfg.all_tasks())}
        self.tracker = RankZeroTracker(loop_config["tracking"], cfg) if self.rank == 0 else None
        self.history: collections.deque = collections.deque(maxlen=HISTORY_LIMIT)
        self.engine = self.sampler = self.source = None

    # ---- set-up ---------------------------------------------------------------------------

    def _build_stage(self, model: torch.nn.Module, k: int) -> None:
        stage = self.plan[k]
        self.engine = build_engine(model, self.cfg, stage.steps, self.world, self.info.device,
                                   stage_index=k)
        # the same sampler seed on every rank → the same task draws; a new stream per stage
        self.sampler = self.components.build_task_sampler(dict(stage.tasks),
                                                          self.cfg.run.seed * 1009 + k)
        self.source = self.components.build_batch_source(self.cfg, stage, k, self.info)

    def _next_stage(self, state: TrainerState) -> None:
        """Initialise stage k+1 from stage k's weights: fresh optimizer and schedule."""
        module = self.engine.module
        self.engine.destroy()   # removes ZeRO's gradient hooks from the shared parameters
        self.engine = None
        self._close_source()
        state.stage += 1
        self._build_stage(module, state.stage)
        state.sampler = self.sampler.state_dict()
        self._say(f"stage {state.stage} '{self.plan[state.stage].name}' starts at step "
                  f"{state.step} from the weights of stage '{self.plan[state.stage - 1].name}'")

    def _check_plan(self, meta: dict[str, Any]) -> None:
        problem = checkpointing.resume_problem(meta, [(s.name, s.steps) for s in self.plan],
                                               self.world)
        if problem:
            raise SetupError(problem)

    def _close_source(self) -> None:
        """Batch sources may hold reader threads (``PretrainBatches.close``)."""
        close = getattr(self.source, "close", None)
        if callable(close):
            close()

    def _setup(self) -> TrainerState:
        import ray.train

        use_extensions_dir(self.cfg.train.extensions_dir)
        checkpointing.seed_everything(self.cfg.run.seed)   # identical model init on every rank
        model = self.components.build_model(self.cfg, list(self.task_ids))
        self.n_params = sum(p.numel() for p in model.parameters())
        self.n_trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        ckpt = ray.train.get_checkpoint()
        if ckpt is None:
            self._build_stage(model, 0)
            state = TrainerState(world_size=self.world, sampler=self.sampler.state_dict())
            # per-rank streams (dropout, ...) from here on
            checkpointing.seed_everything(self.cfg.run.seed + 1 + self.rank)
            return state
        with ckpt.as_directory() as folder:
            meta = checkpointing.read_meta(folder)
            self._check_plan(meta)
            self._build_stage(model, meta["stage"])
            state, per_rank = checkpointing.load(self.engine, folder, self.rank, self.world)
        self.sampler.load_state_dict(state.sampler)
        self.source.load_state_dict(per_rank["batch_source"])
        checkpointing.set_rng_state(per_rank["rng"])   # last: building consumed randomness
        self._say(f"resumed from step {state.step} (stage '{self.plan[state.stage].name}', "
                  f"{state.examples_seen} examples seen)")
        return state

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
            state.mlflow_run_id = self.tracker.open(state.mlflow_run_id, fresh=state.step == 0)
            self._announce(fresh=state.step == 0)
        self._say(f"set-up {t1 - t0:.1f} s (model, engine, checkpoint), tracking "
                  f"{time.perf_counter() - t1:.1f} s")
        window = _Window()
        try:
            while state.step < self.stop_at:
                if state.step == self.stage_ends[state.stage]:
                    self._next_stage(state)
                record = self._optimizer_step(state)
                window.add(record)
                self.history.append(record)
                if self.tracker:
                    self.tracker.add_step(record)
                    if state.step == start_step + 1 and start_step == 0:
                        self._announce_measured(record)
                self._maybe_report(state, window)
        except BaseException:
            if self.tracker:
                self.tracker.flush_quietly()
            raise
        finally:
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

    def _optimizer_step(self, state: TrainerState) -> dict[str, Any]:
        gas, cfg = self.cfg.train.grad_accum, self.cfg.train
        lr = float(self.engine.get_lr()[0])
        sums: dict[str, float] = collections.defaultdict(float)
        counts: dict[str, int] = collections.defaultdict(int)
        tasks, examples, units, done, skips = [], 0, 0, 0, 0
        while done < gas:
            task = self.sampler.next()
            batch = self._to_device(self.source.next(task))
            out = self.engine(batch, task=task)
            ok, means, n_ex, n_units = self._agree(task, out, batch, state)
            if not ok:
                state.skipped_batches += 1
                skips += 1
                msg = (f"non-finite loss at step {state.step + 1}, micro-batch {done + 1}/{gas}, "
                       f"task {task!r} (rank {self.rank} local values "
                       f"{ {k: float(v) for k, v in out.items()} })")
                if cfg.on_nonfinite == "raise":
                    raise FloatingPointError(msg + "; set train.on_nonfinite=skip to drop such "
                                                   "batches")
                if skips > cfg.max_nonfinite_skips:
                    raise FloatingPointError(f"{msg}; {skips} non-finite batches dropped in this "
                                             f"step (train.max_nonfinite_skips="
                                             f"{cfg.max_nonfinite_skips})")
                self._say(msg + ": batch dropped on every rank")
                continue
            self.engine.backward(out["loss"])
            self.engine.step()
            done += 1
            tasks.append(task)
            examples += n_ex
            units += n_units
            for k, v in means.items():
                sums[k] += v
                counts[k] += 1
        state.step += 1
        state.examples_seen += examples
        state.input_units_seen += units
        record = {"step": state.step, "stage": state.stage, "tasks": tasks, "lr": lr,
                  "global_batch_examples": examples, "global_batch_input_units": units}
        record.update({k: sums[k] / counts[k] for k in sums})
        record["loss"] = sums["loss"] / gas
        return record

    def _to_device(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        out = {}
        for k, v in batch.items():
            if isinstance(v, torch.Tensor):
                v = v.to(self.info.device, non_blocking=True)
                if v.is_floating_point() and v.dtype != self.dtype and k not in (NUM_EXAMPLES,
                                                                                 INPUT_UNITS):
                    v = v.to(self.dtype)
            out[k] = v
        return out

    def _agree(self, task: str, out: dict[str, torch.Tensor], batch: dict[str, torch.Tensor],
               state: TrainerState) -> tuple[bool, dict[str, float], int, int]:
        """One all-reduce: non-finite count, task-draw agreement, examples, input units; a
        second for the global mean of each model output when every loss is finite. Only the
        ``*loss`` entries decide finiteness (an accuracy may be NaN on an empty batch)."""
        if "loss" not in out:
            raise KeyError(f"the model returned {sorted(out)} for task {task!r}: a 'loss' "
                           "entry (the total) is required")
        keys = sorted(out)
        vals = torch.stack([out[k].detach().float().reshape(()) for k in keys])
        is_loss = torch.tensor([k.endswith("loss") for k in keys], device=vals.device)
        finite = bool(torch.isfinite(vals[is_loss]).all())
        idx = float(self.task_ids[task])
        n_ex = int(batch[NUM_EXAMPLES]) if NUM_EXAMPLES in batch else _leading_dim(batch)
        n_units = int(batch[INPUT_UNITS]) if INPUT_UNITS in batch else 0
        head = torch.tensor([0.0 if finite else 1.0, idx, idx * idx, n_ex, n_units, len(keys)],
                            dtype=torch.float64, device=vals.device)
        dist.all_reduce(head)
        if head[1] ** 2 != self.world * head[2] or head[5] != self.world * len(keys):
            raise RuntimeError(
                f"ranks disagree at step {state.step + 1}: rank {self.rank} drew task {task!r} "
                f"with outputs {keys}, others differ. The task sampler must be seeded "
                "identically on every rank")
        if head[0] > 0:
            return False, {}, 0, 0
        vals = torch.nan_to_num(vals, nan=0.0, posinf=0.0, neginf=0.0)
        dist.all_reduce(vals)
        vals /= self.world
        return True, dict(zip(keys, vals.tolist())), int(head[3]), int(head[4])

    # ---- reporting, checkpoints -------------------------------------------------------------

    def _maybe_report(self, state: TrainerState, window: _Window) -> None:
        import ray.train

        step = state.step
        at_stage_end = step in self.stage_ends
        save = step % self.cfg.checkpoint.interval == 0 or step == self.stop_at or at_stage_end
        if not save and step % self.cfg.train.log_every:
            return
        metrics = window.summary(state)
        window.reset()
        if not save:
            if self.tracker:
                self.tracker.flush(metrics, step)
            ray.train.report(metrics)
            return
        state.sampler = self.sampler.state_dict()
        if self.tracker and self.tracker.run_id:   # known once the tracking queue opened it
            state.mlflow_run_id = self.tracker.run_id
        name = _checkpoint_dir_name(step)
        with tempfile.TemporaryDirectory(prefix="vlp-ckpt-") as tmp:
            checkpointing.save(self.engine, tmp, state, self.rank, self.source.state_dict(),
                               stages=[(s.name, s.steps) for s in self.plan])
            ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(tmp),
                             checkpoint_dir_name=name)
        if self.tracker:
            self.tracker.flush(metrics, step, checkpoint=posixpath.join(self.run_dir, name))

    def _announce(self, fresh: bool) -> None:
        c, plan = self.cfg, self.plan
        micro = c.train.grad_accum * self.world
        budget = c.data.batch_input_units * micro
        stages = ", ".join(f"{s.name}: {s.steps}" for s in plan)
        lines = [
            f"model {c.model.family}: {self.n_params:,} parameters ({self.n_trainable:,} "
            f"trainable); tasks {', '.join(self.task_ids)}",
            f"steps: {self.total:,} in {len(plan)} stage(s) ({stages}); {c.train.grad_accum} "
            f"micro-batch(es) × {self.world} worker(s) = {micro} per step",
            f"global batch: ≤ {budget:,} input units per step ({c.data.batch_input_units:,} "
            f"per micro-batch); examples per step are measured at step 1 (budget batching)",
        ]
        for line in lines:
            self._say(line)
        if fresh:
            self.tracker.log_derived({"parameters": self.n_params,
                                      "trainable_parameters": self.n_trainable,
                                      "total_steps": self.total, "micro_batches_per_step": micro,
                                      "global_batch_input_units_budget": budget})

    def _announce_measured(self, record: dict[str, Any]) -> None:
        self._say(f"step 1: global batch = {record['global_batch_examples']:,} examples, "
                  f"{record['global_batch_input_units']:,} input units")
        self.tracker.log_derived({
            "global_batch_examples_step1": record["global_batch_examples"],
            "global_batch_input_units_step1": record["global_batch_input_units"]})

    def _say(self, text: str) -> None:
        if self.rank == 0:
            print(f"[vlp pretrain] {text}", flush=True)


def _checkpoint_dir_name(step: int) -> str:
    return f"checkpoint_{checkpointing.step_tag(step)}"


def _leading_dim(batch: dict[str, torch.Tensor]) -> int:
    for v in batch.values():
        if isinstance(v, torch.Tensor) and v.ndim > 0:
            return int(v.shape[0])
    return 0


class _Window:
    """Means and throughput over the steps since the last report."""

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.t0 = time.perf_counter()
        self.sums: dict[str, float] = collections.defaultdict(float)
        self.counts: dict[str, int] = collections.defaultdict(int)
        self.examples = self.units = 0
        self.last: dict[str, Any] = {}

    def add(self, record: dict[str, Any]) -> None:
        self.last = record
        self.examples += record["global_batch_examples"]
        self.units += record["global_batch_input_units"]
        for k, v in record.items():
            if k not in BOOKKEEPING and isinstance(v, float) and math.isfinite(v):
                self.sums[k] += v
                self.counts[k] += 1

    def summary(self, state: TrainerState) -> dict[str, Any]:
        dt = max(time.perf_counter() - self.t0, 1e-9)
        out: dict[str, Any] = {k: self.sums[k] / self.counts[k] for k in self.sums}
        out.update(step=state.step, stage=state.stage, lr=self.last.get("lr", 0.0),
                   examples_per_s=self.examples / dt, input_units_per_s=self.units / dt,
                   examples_seen=state.examples_seen, input_units_seen=state.input_units_seen,
                   skipped_batches=state.skipped_batches)
        return out
