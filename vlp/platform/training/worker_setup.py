"""A training worker's set-up (``loop.py`` runs the steps): its rank, device and dtype, the
model with its initial weights, per stage an engine, task sampler, batch source and prefetch,
and on a resume the checkpoint's weights, sampler, source position and RNG. A stage boundary
rebuilds the engine (fresh optimizer and schedule) on the same module."""

from __future__ import annotations

import collections
from typing import Any

import torch

from vlp.models.flops import EncoderShape, encoder_shape
from vlp.platform.training import checkpointing, objective
from vlp.platform.training.checkpointing import TrainerState
from vlp.platform.training.compile_static import compile_static
from vlp.platform.training.cuda_graph_step import GraphedSteps, engine_steps
from vlp.platform.training.cuda_graph_step import check as graphs_problem
from vlp.platform.training.device_peaks import device_name, peak_flops
from vlp.platform.training.device_step import uses_device_step
from vlp.platform.training.engine import build_engine, compute_dtype, resolve_precision
from vlp.platform.training.failures import SetupError
from vlp.platform.training.global_draws import GlobalDraws
from vlp.platform.training.loop_config import LoopConfig
from vlp.platform.training.prefetch import Prefetcher
from vlp.platform.training.protocols import WorkerInfo
from vlp.platform.training.reporter import Reporter
from vlp.platform.training.worker_context import RayTrainContext
from vlp.platform.tracking.rank_zero import RankZeroTracker

HISTORY_LIMIT = 10_000          # per-step records kept for the return value (MLflow has all)


class WorkerSetup:
    graphs: GraphedSteps | None = None      # train.cuda_graphs: the steps by batch shape

    def __init__(self, cfg: LoopConfig, loop_config: dict[str, Any]):
        self.cfg = cfg
        self.components = loop_config["components"]
        self.run_dir = loop_config["run_dir"]
        ctx = loop_config.get("context") or RayTrainContext()
        self.context = ctx
        self.rank, self.world = ctx.rank, ctx.world_size
        device = ctx.device(cfg.scaling.use_gpu)
        self.info = WorkerInfo(self.rank, self.world, ctx.local_rank, device, cfg.seed)
        self.dtype = compute_dtype(cfg, device)
        self.precision = resolve_precision(cfg, device)
        self.peak = peak_flops(device_name(device), self.precision, cfg.train.peak_tflops)
        self.shape: EncoderShape | None = None
        self.overflow_skips = 0
        self.plan = cfg.stages
        self.stage_ends = [sum(s.steps for s in self.plan[:i + 1]) for i in range(len(self.plan))]
        self.total = self.stage_ends[-1]
        self.stop_at = min(self.total, cfg.train.stop_after or self.total)
        # tasks with a positive ratio in some stage: the model's heads; the cross-rank check's ids
        self.task_ids = {t: i for i, t in enumerate(cfg.all_tasks())}
        self.tracker = RankZeroTracker(loop_config["tracking"], cfg) if self.rank == 0 else None
        self.history: collections.deque = collections.deque(maxlen=HISTORY_LIMIT)
        self.engine = self.sampler = self.source = self.prefetch = None
        self.reporter: Reporter | None = None

    # ---- set-up ---------------------------------------------------------------------------

    def _build_stage(self, model: torch.nn.Module, k: int, task_group: int | None = None
                     ) -> None:
        """Stage ``k``'s engine, sampler, source and prefetch; ``task_group``: a global
        stream's draw group (``global_draws``; None: this world, a run's start)."""
        stage = self.plan[k]
        self.engine = build_engine(model, self.cfg, stage.steps, self.world, self.info.device,
                                   stage_index=k)
        self.graphs = None
        if self.cfg.train.cuda_graphs:
            problem = graphs_problem(self.info.device, self.cfg.train.grad_accum, self.world,
                                     uses_device_step(self.engine.optimizer),
                                     self.cfg.train.on_nonfinite)
            if problem:
                raise SetupError(problem)
            self.graphs = engine_steps(self.engine)
        # the same sampler seed on every rank → the same task draws; a new stream per stage
        self.sampler = objective.build_sampler(self.components, dict(stage.tasks),
                                               self.cfg.seed * 1009 + k,
                                               self.cfg.train.objective,
                                               self.cfg.train.forward_groups)
        self.source = self.components.build_batch_source(self.cfg, stage, k, self.info)
        if getattr(self.source, "global_order", False):   # draws by global micro-batch index
            self.sampler = GlobalDraws(self.sampler, self.world, task_group)
        # started at its first next(), after a resume has loaded the sampler and the source
        self.prefetch = Prefetcher(self.sampler, self.source, depth=self.cfg.train.prefetch_batches,
                                   device=self.info.device, dtype=self.dtype,
                                   builder=self.cfg.train.batch_builder,
                                   builders=self.cfg.train.batch_builders)

    def _next_stage(self, state: TrainerState) -> None:
        """Initialise stage k+1 from stage k's weights: fresh optimizer and schedule."""
        module = self.engine.module
        self.engine.destroy()   # removes ZeRO's gradient hooks from the shared parameters
        self.engine = None
        self._close_source()
        state.stage += 1
        self._build_stage(module, state.stage, getattr(self.sampler, "group", None))
        state.sampler = self.prefetch.state_dict()["sampler"]
        self._say(f"stage {state.stage} '{self.plan[state.stage].name}' starts at step "
                  f"{state.step} from the weights of stage '{self.plan[state.stage - 1].name}'")

    def _check_plan(self, meta: dict[str, Any]) -> None:
        problem = checkpointing.resume_problem(meta, self.cfg.stage_steps(), self.world,
                                               self.cfg.train.zero_stage,
                                               self.cfg.train.grad_accum)
        if problem:
            raise SetupError(problem)
        self.cfg = checkpointing.follow_checkpoint(self.cfg, meta, self.world)

    def _check_source_reshardable(self, meta: dict[str, Any]) -> None:
        """On another number of workers than the checkpoint's, the batch source must map the
        saved workers' positions to its own (``load_resharded_state``); refused otherwise."""
        reshardable = getattr(self.source, "reshardable",
                              callable(getattr(self.source, "load_resharded_state", None)))
        if meta["world_size"] == self.world or reshardable:
            return
        why = ("data.stream: per_worker" if hasattr(self.source, "reshardable")
               else "no load_resharded_state")
        raise SetupError(checkpointing.stream_per_worker(
            meta["world_size"], self.world, f"its batch source ({type(self.source).__name__}, "
            f"{why})"))

    def _close_source(self) -> None:
        """The prefetch thread first (it may be inside ``source.next``), then the source:
        batch sources may hold reader threads (``PretrainBatches.close``)."""
        if self.prefetch is not None:
            self.prefetch.close()
        close = getattr(self.source, "close", None)
        if callable(close):
            close()

    def _setup(self) -> TrainerState:
        checkpointing.seed_everything(self.cfg.seed)   # identical model init on every rank
        model = self.components.build_model(self.cfg, list(self.task_ids))
        if self.cfg.train.activation_checkpointing:
            set_checkpointing = getattr(model, "set_activation_checkpointing", None)
            if set_checkpointing is None:
                raise ValueError(f"train.activation_checkpointing: the model "
                                 f"{type(model).__name__} has no set_activation_checkpointing")
            set_checkpointing(True)
        self.shape = encoder_shape(model)
        if self.cfg.train.compile:
            compile_static(model)
        self.n_params = sum(p.numel() for p in model.parameters())
        self.n_trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        with self.context.checkpoint_folder() as folder:
            if folder is None:
                self._build_stage(model, 0)
                state = TrainerState(world_size=self.world,
                                     sampler=self.prefetch.state_dict()["sampler"])
                # per-rank streams (dropout, ...) from here on
                checkpointing.seed_everything(self.cfg.seed + 1 + self.rank)
                return state
            meta = checkpointing.read_meta(folder)
            saved_gas = meta.get("grad_accum", self.cfg.train.grad_accum)
            self._check_plan(meta)
            self._build_stage(model, meta["stage"])
            other_world = meta["world_size"] != self.world
            self._check_source_reshardable(meta)
            state, per_rank = checkpointing.load(self.engine, folder, self.rank, self.world)
        self.sampler.load_state_dict(state.sampler)
        if not other_world:
            self.source.load_state_dict(per_rank["batch_source"])
            checkpointing.set_rng_state(per_rank["rng"])   # last: building consumed randomness
        else:
            self.source.load_resharded_state(per_rank["batch_sources"], meta["world_size"])
            # no saved stream for a new rank: every rank's (dropout, ...) seeded anew from
            # (seed, step, rank), so that the same resume is the same run twice
            checkpointing.seed_everything(
                self.cfg.seed + 1 + self.rank + 1_000_003 * (1 + state.step))
            self._say(f"resuming on another number of workers: {meta['world_size']} → "
                      f"{self.world} workers, grad_accum {saved_gas} → "
                      f"{self.cfg.train.grad_accum} (global batch {meta['world_size'] * saved_gas}"
                      f" micro-batches a step kept); the data stream continues from the "
                      f"{meta['world_size']} workers' position")
        self._say(f"resumed from step {state.step} (stage '{self.plan[state.stage].name}', "
                  f"{state.examples_seen} examples seen, ZeRO stage {meta['zero_stage']})")
        return state

    # ---- output ----------------------------------------------------------------------------

    def _say(self, text: str) -> None:
        if self.rank == 0:
            print(f"[vlp {self.cfg.job}] {text}", flush=True)

