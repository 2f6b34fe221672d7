"""``LoopConfig``: what the general training loop reads, and nothing more.

The loop (``loop.py``), its DeepSpeed engine (``engine.py``), the Ray Train launch
(``launch.py``) and the rank-0 tracker read this config only. Pretraining builds one from
its experiment config (``vlp.platform.pretrain.loop_config``), finetuning one per benchmark
from its finetune config; neither sees the other's config.

Frozen dataclasses: a ``LoopConfig`` is built once on the driver, after every check, and
pickled into every worker. The defaults are the pretraining experiment config's (a test
holds them equal), so a finetune that sets no value trains as before.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal


@dataclass(frozen=True)
class LoopStage:
    """One stage: a fresh optimizer and schedule over ``steps`` steps, each micro-batch's task
    drawn from ``tasks`` (task → mix ratio)."""
    name: str
    steps: int
    tasks: dict[str, float]


@dataclass(frozen=True)
class LoopTrain:
    grad_accum: int = 1                   # micro-batches per optimizer step
    # sampled: one task per micro-batch, drawn by mix ratio; summed: every task's loss on
    # one example set, weighted by its ratio (training/objective.py)
    objective: Literal["sampled", "summed"] = "sampled"
    # summed: tasks sharing one batch and one forward (resolved: the family's or the config's)
    forward_groups: tuple[tuple[str, ...], ...] = ()
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"
    zero_stage: Literal["auto", 0, 1, 2] = "auto"   # auto: engine.zero_stage (1 by default)
    # bf16 under ZeRO-1 on several ranks: the gradient all-reduce in buckets of
    # grad_bucket_elements (0: an eighth of the model, >= 1e6), started during the last
    # micro-batch's backward, in grad_wire_dtype (grad_exchange.py)
    grad_overlap: bool = True
    grad_bucket_elements: int = 0
    grad_wire_dtype: Literal["fp32", "bf16"] = "fp32"
    # one all-reduce timed at start, its bus bandwidth beside the link's (bus_bandwidth.py);
    # auto: GPU runs of more than one worker. interconnect_mb: 0 = 256 on GPUs, 16 on CPUs
    interconnect_check: Literal["auto", True, False] = "auto"
    interconnect_mb: int = 0
    activation_checkpointing: bool = False
    compile: bool = False                 # torch.compile, fullgraph, static shapes
    cuda_graphs: bool = False             # the whole step as a CUDA graph per batch shape
    prefetch_batches: int = 2             # micro-batches built ahead; 0 = off
    # where they are built: a thread of the worker, or a process of their own (batch_process)
    batch_builder: Literal["thread", "process"] = "thread"
    batch_builders: int | Literal["auto"] = 1   # processes (batch_builder: process)
    peak_tflops: float = 0.0              # device peak for MFU; 0 = from the device name
    log_every: int = 10                   # steps between reports / MLflow flushes
    on_nonfinite: Literal["raise", "skip"] = "raise"
    max_nonfinite_skips: int = 10
    stop_after: int = 0                   # stop cleanly (with a checkpoint) here; 0 = off
    extensions_dir: str = ""              # TORCH_EXTENSIONS_DIR for DeepSpeed's JIT ops


@dataclass(frozen=True)
class LoopOptimizer:
    lr: float = 5e-5
    betas: tuple[float, float] = (0.9, 0.98)
    eps: float = 1e-6
    weight_decay: float = 0.01
    warmup_steps: int = 10_000            # per stage
    schedule: Literal["linear", "constant", "step"] = "linear"
    milestones: tuple[int, ...] = ()      # step: optimizer steps (per stage) where lr × factor
    decay_factor: float = 0.1
    grad_clip: float = 5.0                # 0 = off
    impl: Literal["auto", "torch", "torch-fused", "deepspeed-fused"] = "auto"
    # a model with a CNN (SOHO): its optimizer beside AdamW, and how many steps of the first
    # stage it stays frozen (the cold start)
    cnn: Literal["sgd", "adamw"] = "sgd"
    cnn_lr: float = 1e-2
    cnn_weight_decay: float = 5e-4
    cnn_momentum: float = 0.9
    cold_start_steps: int = 0


@dataclass(frozen=True)
class LoopScaling:
    num_workers: int = 2
    use_gpu: bool = False
    cpus_per_worker: float = 1.0
    placement_strategy: Literal["PACK", "SPREAD"] = "PACK"
    accelerator_type: str = ""


@dataclass(frozen=True)
class LoopConfig:
    name: str                             # the run: its folder in ``storage``, its MLflow run
    storage: str                          # the run storage root, resolved (``run_storage``)
    stages: tuple[LoopStage, ...]
    seed: int = 0
    max_failures: int = 1                 # worker failures retried from the last checkpoint
    checkpoint_interval: int = 1000       # steps; the last step is always checkpointed
    checkpoint_keep: int = 2
    family: str = ""                      # the model family, for the log lines
    job: Literal["pretrain", "finetune"] = "pretrain"   # the job that built it: log lines
    # the input-unit budget of a micro-batch, for the log lines; 0 = the batches count
    # examples (finetuning)
    batch_input_units: int = 0
    train: LoopTrain = field(default_factory=LoopTrain)
    optimizer: LoopOptimizer = field(default_factory=LoopOptimizer)
    scaling: LoopScaling = field(default_factory=LoopScaling)

    def __post_init__(self):
        if not self.stages:
            raise ValueError(f"loop {self.name!r}: expected at least one stage")

    def total_steps(self) -> int:
        return sum(s.steps for s in self.stages)

    def all_tasks(self) -> list[str]:
        """Every task with a non-zero ratio in any stage, in first-seen order (the model's
        heads)."""
        out: list[str] = []
        for st in self.stages:
            out += [t for t, r in st.tasks.items() if r > 0 and t not in out]
        return out

    def stage_steps(self) -> list[tuple[str, int]]:
        """(name, steps) per stage: what a checkpoint records and a resume compares."""
        return [(s.name, s.steps) for s in self.stages]


def project(cls: type, section: Any, **changes: Any) -> Any:
    """``cls`` (a Loop* section) filled from the same-named fields of ``section`` (a job's
    config section that carries them), then ``changes``."""
    values = {f.name: getattr(section, f.name) for f in dataclasses.fields(cls)
              if f.name not in changes}
    return cls(**values, **changes)
