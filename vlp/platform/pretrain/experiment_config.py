"""The pretraining experiment config: one YAML file describes a run.

Load with ``load_experiment_config(path, overrides=["optimizer.lr=1e-4"], task_names=...)``.
Task names are checked against the task registry (``vlp.tasks``, imported on the first load
so that importing this module does not import torch). The ``data`` section is the pipeline's
``DataConfig`` as a user writes it (see ``DataSection``); ``vlp.platform.pretrain.data`` maps
it, with the model's preprocessing, onto one ``DataConfig`` per stage. The ``train`` section
is ``TrainSection`` (``train_section.py``).

Defaults follow UNITER's in-domain base recipe (AdamW lr 5e-5, betas (0.9, 0.98), weight
decay 0.01, warm-up then linear decay, grad-norm clip 5.0, itm:mlm:mrfr:mrc-kl = 2:2:1:1),
except precision (``auto``: bf16 on a bf16-capable GPU, fp32 on CPU) and steps (set them per
run). For another family, the optimizer keys a config leaves out are that family's paper's
(``family_defaults.py``) and so is the region selection (``data_config.family_regions``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from vlp.contract.config_loader import ConfigError, ConfigModel, load_config
from vlp.datasets.stream.data_config import PipelineOptions, RegionConfig, batch_units_field
from vlp.platform.pretrain.train_section import TrainSection

# NVIDIA GPU types as Ray names them (ray.util.accelerators): scaling.accelerator_type
ACCELERATOR_TYPES = ("T4", "V100", "A10G", "L4", "L40S", "A100", "H100", "H200", "B200")

_Beta = Annotated[float, Field(ge=0, lt=1)]
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def name_and_folder_problems(name: str, output_dir: str) -> Iterable[tuple[str, str]]:
    """A run or sweep name becomes a folder name; its output folder must be given."""
    if not _NAME.match(name):
        yield "name", f"expected letters, digits, '_', '.', '-' (a folder name), got {name!r}"
    if not output_dir:
        yield "output_dir", "expected a folder path, got ''"


class RunSection(ConfigModel):
    name: str = "pretrain"          # Ray Train run name (a folder name): resume = same name
    output_dir: str = "runs"        # runs root; relative paths resolve against the driver's cwd
    # where checkpoints and artifacts live: a folder or a URI (s3://bucket/vlp); "" =
    # $VLP_STORAGE, else output_dir. A multi-node cluster needs a URI or a shared mount
    storage: str = ""
    seed: int = Field(0, ge=0)
    max_failures: int = Field(1, ge=-1)   # worker failures retried from the last checkpoint

    def validate(self):
        yield from name_and_folder_problems(self.name, self.output_dir)


class ModelSection(ConfigModel):
    family: str = "uniter-tiny"     # a name in the model-family registry
    # random | minilm (packaged MiniLM text weights) | bert, uniter (weights at init_path)
    init: Literal["random", "minilm", "bert", "uniter"] = "random"
    init_path: str = ""
    dropout: float = Field(0.1, ge=0, lt=1)   # hidden and attention dropout (UNITER: 0.1)
    # SOHO: the CNN is frozen for this many optimizer steps of the first stage (the paper's
    # cold start: 10 of 40 epochs); the dictionary and the Transformer train meanwhile
    cold_start_steps: int = Field(0, ge=0)
    cnn_init: str = ""     # SOHO: a torchvision ResNet state dict (ImageNet weights), path or URI
    # SOHO's visual dictionary start: "" = the family's (data: the first batch's features,
    # vlp's default); normal: N(0, 1), the paper's "randomly initialized" (§3.2)
    dictionary_init: Literal["", "data", "normal"] = ""
    # "vcr": UNITER's VCR second stage: the token-type table gains the answer and rationale
    # rows (copied from the text row) and captions "question [SEP] answer [SEP] rationale"
    # carry their segments' types; "" = the family's own types
    token_types: Literal["", "vcr"] = ""
    # the encoder's query, key and value projections as one product on flat rows (the same
    # weights and results, fewer host operations: vlp/models/fused_qkv.py); false runs
    # transformers' own three
    fused_qkv: bool = True
    # the encoder's self-attention over whole packed rows with a padding mask (padded) or
    # over each row's real tokens only (varlen: CUDA's variable-length kernels, attention
    # dropout kept; vlp/models/varlen_attention.py)
    attention: Literal["padded", "varlen"] = "padded"
    # MRFR's loss: "" = the family's (sum-features, the papers' Σ over the feature width per
    # masked region, UNITER §3.2 / ImageBERT §4.3); mean-elements = the reference code's mean
    # over regions × width (vlp/tasks/mrfr.py)
    mrfr_reduction: Literal["", "sum-features", "mean-elements"] = ""

    def validate(self):
        if not self.family:
            yield "family", "expected a model family name, got ''"
        if self.init in ("bert", "uniter") and not self.init_path:
            yield "init_path", f"required when model.init is {self.init!r}"
        if self.init not in ("bert", "uniter") and self.init_path:
            yield "init_path", f"only used with model.init bert or uniter (init is {self.init!r})"

    def init_spec(self) -> str:
        """The ``init`` argument of ``vlp.models.create_model``."""
        return f"{self.init}:{self.init_path}" if self.init_path else self.init


class SourceSection(ConfigModel):
    path: str
    weight: float = Field(1.0, ge=0)   # sampling weight among a stage's sources


class DataSection(PipelineOptions):
    """The pipeline's options a pretraining run sets (``PipelineOptions``: the same names,
    defaults and checks as ``vlp.datasets.DataConfig``), the batch budget under the name
    ``batch_input_units``, and the ``sources``, named here so that stages can pick them. Not
    here: what the model family decides (visual input, location encoding, whole-image
    feature, pixel sizes and SOHO's texts per image) and the seed (``run.seed``)."""
    sources: dict[str, SourceSection] = Field(default_factory=dict)
    # per worker per micro-batch: B × the longest packed row (text + regions)
    batch_units: int = batch_units_field(alias="batch_input_units")
    # null = the family's paper's selection (data_config.FAMILY_REGIONS: UNITER
    # conf > 0.2 with 10-100, VL-BERT conf > 0.5 with 10-100, ImageBERT the top 100)
    regions: RegionConfig | None = None

    @property
    def batch_input_units(self) -> int:
        return self.batch_units

    def validate(self):
        if not self.sources:
            yield "sources", "expected at least one source {name: {path, weight}}"
        elif all(s.weight == 0 for s in self.sources.values()):
            yield "sources", "all source weights are 0: at least one must be positive"
        for name, s in self.sources.items():
            if not s.path:
                yield f"sources.{name}.path", "expected a path, got ''"
        yield from super().validate()   # again with the model's input in pretrain_data

    def max_example_units(self) -> int:
        if self.regions is None:     # every family's default takes at most 100 regions
            return self.max_text_len + 2 + RegionConfig().max_per_image()
        return super().max_example_units()

    def pipeline_options(self) -> dict:
        """This section as ``DataConfig`` keyword arguments (without sources)."""
        return {name: getattr(self, name) for name in PipelineOptions.model_fields}


class StageSection(ConfigModel):
    name: str
    steps: int = Field(gt=0)
    sources: list[str] = Field(default_factory=list)     # [] = every data source
    tasks: dict[str, float] = Field(default_factory=dict)  # {} = the top-level task mix


class OptimizerSection(ConfigModel):
    lr: float = Field(5e-5, gt=0)
    betas: tuple[_Beta, _Beta] = (0.9, 0.98)
    eps: float = Field(1e-6, gt=0)
    weight_decay: float = Field(0.01, ge=0)      # not applied to biases and norm weights
    warmup_steps: int = Field(10_000, ge=0)      # per stage
    # after warm-up: linear decay to 0, constant, or step: × decay_factor at each of
    # `milestones` (optimizer steps of the stage; SOHO §4.1: ×0.1 at epochs 25 and 35 of 40)
    schedule: Literal["linear", "constant", "step"] = "linear"
    milestones: list[int] = Field(default_factory=list)
    decay_factor: float = Field(0.1, gt=0, le=1)
    grad_clip: float = Field(5.0, ge=0)          # global grad-norm clip; 0 = off
    # auto: torch's fused AdamW, on GPU and CPU (its kernels ship in the wheel: nothing built)
    impl: Literal["auto", "torch", "torch-fused", "deepspeed-fused"] = "auto"
    # a model with a CNN (SOHO): SGD for the CNN beside AdamW for the rest (SOHO §4.1: SGD lr
    # 1e-2, weight decay 5e-4; momentum 0.9 is ours), or adamw: the CNN shares the AdamW above
    cnn: Literal["sgd", "adamw"] = "sgd"
    cnn_lr: float = Field(1e-2, gt=0)
    cnn_weight_decay: float = Field(5e-4, ge=0)
    cnn_momentum: float = Field(0.9, ge=0, lt=1)


class ScalingSection(ConfigModel):
    num_workers: int = Field(2, ge=1)
    use_gpu: bool = False
    cpus_per_worker: float = Field(1.0, gt=0)
    # PACK: as few nodes as possible; SPREAD: one worker per node where it can
    placement_strategy: Literal["PACK", "SPREAD"] = "PACK"
    # the one GPU type every worker runs on ("" = any): Ray's ``accelerator_type:<name>``
    # resource, which each GPU node reports and cluster.yaml's node types declare, so a
    # config lands on its GPU type and never on a mix
    accelerator_type: str = ""

    def validate(self):
        if self.accelerator_type and self.accelerator_type not in ACCELERATOR_TYPES:
            yield "accelerator_type", (f"unknown GPU type {self.accelerator_type!r}; known: "
                                       f"{', '.join(ACCELERATOR_TYPES)} (Ray's names)")
        if self.accelerator_type and not self.use_gpu:
            yield "accelerator_type", "only used with use_gpu: true"


class CheckpointSection(ConfigModel):
    interval: int = Field(1000, gt=0)   # steps; the last step is always checkpointed
    keep: int = Field(2, ge=1)


class MlflowSection(ConfigModel):
    enabled: bool = True
    # "" = $MLFLOW_TRACKING_URI, else sqlite:///<output_dir>/mlflow.db (embedded)
    tracking_uri: str = ""
    experiment: str = "vlp-pretrain"
    check_timeout_s: float = Field(3.0, gt=0)
    # steps per MLflow row: each metric's mean over the window (10: a 500k-step run logs 50k
    # rows per metric); every step's record is in the run's storage (<run>/steps/*.parquet)
    metric_window: int = Field(10, gt=0)


def _uniter_mix() -> dict[str, float]:
    return {"itm": 2.0, "mlm": 2.0, "mrfr": 1.0, "mrc-kl": 1.0}


class ExperimentConfig(ConfigModel):
    run: RunSection = Field(default_factory=RunSection)
    model: ModelSection = Field(default_factory=ModelSection)
    data: DataSection = Field(default_factory=DataSection)
    tasks: dict[str, float] = Field(default_factory=_uniter_mix)   # mix ratios
    stages: list[StageSection] = Field(default_factory=list)     # [] = one stage "pretrain"
    train: TrainSection = Field(default_factory=TrainSection)
    optimizer: OptimizerSection = Field(default_factory=OptimizerSection)
    scaling: ScalingSection = Field(default_factory=ScalingSection)
    checkpoint: CheckpointSection = Field(default_factory=CheckpointSection)
    mlflow: MlflowSection = Field(default_factory=MlflowSection)

    @model_validator(mode="before")
    @classmethod
    def _family_defaults(cls, raw: Any) -> Any:
        """The optimizer keys a config leaves out are its family's paper's, not UNITER's
        (``family_defaults.py``); the data section's regions likewise (``regions: null``,
        resolved with the model in ``pretrain/data.py``)."""
        from vlp.platform.pretrain.family_defaults import with_family_defaults

        return with_family_defaults(raw)

    def validate(self):
        """Cross-section rules (task names are checked in ``check_task_names``)."""
        yield from _check_mix(self.tasks, "tasks")
        if self.train.precision == "fp16" and not self.scaling.use_gpu:
            yield "train.precision", ("fp16 is not supported on CPU (DeepSpeed refuses it): "
                                      "use bf16 or fp32, or set scaling.use_gpu=true")
        if self.train.cuda_graphs:
            yield from self._check_cuda_graphs()
        if not self.stages and self.train.steps == 0:
            yield "train.steps", "expected an integer > 0 (or a list of stages with steps)"
        if self.stages:
            total = sum(s.steps for s in self.stages if isinstance(s.steps, int))
            if self.train.steps not in (0, total):
                yield "train.steps", (f"is {self.train.steps} but the stages sum to {total} "
                                      f"steps: set it to 0 or {total}")
        seen = set()
        for i, st in enumerate(self.stages):
            key = f"stages.{i}"
            if st.name in seen:
                yield f"{key}.name", f"duplicate stage name {st.name!r}"
            seen.add(st.name)
            for j, src in enumerate(st.sources):
                if src not in self.data.sources:
                    yield f"{key}.sources.{j}", (f"unknown data source {src!r} (known: "
                                                 f"{', '.join(self.data.sources)})")
            if st.tasks:
                yield from _check_mix(st.tasks, f"{key}.tasks")
        first = self.stage_plan()[0]
        cold = self.model.cold_start_steps
        if isinstance(first.steps, int) and isinstance(cold, int) and 0 < first.steps <= cold:
            yield "model.cold_start_steps", (
                f"is {self.model.cold_start_steps} but the first stage {first.name!r} has "
                f"{first.steps} steps: the CNN would never train in it; expected fewer")
        o = self.optimizer
        if o.schedule == "step" and not o.milestones:
            yield "optimizer.milestones", "is empty but optimizer.schedule is step: expected " \
                                          "the steps where the learning rate drops"
        if o.milestones and list(o.milestones) != sorted(set(o.milestones)):
            yield "optimizer.milestones", f"is {o.milestones}: expected increasing steps"
        if o.milestones and o.schedule != "step":
            yield "optimizer.milestones", (f"is set but optimizer.schedule is {o.schedule}: "
                                           f"milestones apply to schedule step only")
        for st in self.stage_plan():
            if o.schedule == "step" and o.milestones and o.milestones[-1] >= st.steps:
                yield "optimizer.milestones", (
                    f"last milestone {o.milestones[-1]} is not inside stage {st.name!r} "
                    f"({st.steps} steps)")
            if self.optimizer.schedule == "linear" and self.optimizer.warmup_steps >= st.steps:
                yield "optimizer.warmup_steps", (
                    f"is {self.optimizer.warmup_steps} but stage {st.name!r} has only "
                    f"{st.steps} steps: the learning rate would never decay; expected fewer")

    def _check_cuda_graphs(self):
        """What ``train.cuda_graphs`` needs that the config alone shows (the worker checks the
        rest, ``training/cuda_graph_step.check``: the device it got, the engine's step, one
        worker: `--local` runs a config of N workers on one)."""
        t, key = self.train, "train.cuda_graphs"
        if not self.scaling.use_gpu:
            yield key, ("captures the step as CUDA graphs, and scaling.use_gpu is false: set "
                        "scaling.use_gpu=true, or train.cuda_graphs=false")
        if t.grad_accum != 1:
            yield key, (f"captures steps of one micro-batch, and train.grad_accum is "
                        f"{t.grad_accum}")
        if t.on_nonfinite != "raise":
            yield key, ("train.on_nonfinite skip decides on the host before each backward; "
                        "the captured step skips a non-finite update on the device: leave it "
                        "raise")
        if t.precision in ("fp32", "fp16") or t.zero_stage == 2:
            yield key, (f"needs the device step (bf16 under ZeRO-1 or none), and the config "
                        f"sets precision {t.precision}, zero_stage {t.zero_stage}")

    # ---- derived ------------------------------------------------------------------------

    def stage_plan(self) -> list[StageSection]:
        """The stages with defaults filled in (sources, task mix)."""
        # built unchecked: the rules that call this report a bad step count themselves
        stages = self.stages or [StageSection.model_construct(name="pretrain",
                                                              steps=self.train.steps)]
        return [StageSection.model_construct(
            name=s.name, steps=s.steps, sources=list(s.sources) or list(self.data.sources),
            tasks=dict(s.tasks) or dict(self.tasks)) for s in stages]

    def total_steps(self) -> int:
        return sum(s.steps for s in self.stage_plan())

    def all_tasks(self) -> list[str]:
        """Every task with a non-zero ratio in any stage, in first-seen order (the model's
        heads)."""
        out: list[str] = []
        for st in self.stage_plan():
            out += [t for t, r in st.tasks.items() if r > 0 and t not in out]
        return out


def _check_mix(mix: dict[str, float], key: str):
    if not mix:
        yield key, "expected at least one task with a positive ratio"
        return
    for name, ratio in mix.items():
        if not isinstance(ratio, (int, float)) or not math.isfinite(ratio) or ratio < 0:
            yield f"{key}.{name}", f"expected a mix ratio ≥ 0, got {ratio!r}"
    if all(isinstance(r, (int, float)) and r == 0 for r in mix.values()):
        yield key, "all mix ratios are 0: at least one task must have a positive ratio"


def check_task_names(cfg: ExperimentConfig, task_names: Iterable[str]) -> list[tuple[str, str]]:
    """Problems for task names the model registry does not know."""
    import difflib

    known = list(task_names)
    problems = []
    mixes = [("tasks", cfg.tasks)] + [(f"stages.{i}.tasks", s.tasks)
                                       for i, s in enumerate(cfg.stages)]
    mixes += [(f"train.forward_groups.{i}", {t: 1 for t in g})
              for i, g in enumerate(cfg.train.forward_groups or [])]
    for key, mix in mixes:
        for name in mix:
            if name not in known:
                close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                problems.append((f"{key}.{name}", f"unknown task {name!r}; known tasks: "
                                                  f"{', '.join(known)}{hint}"))
    return problems


def check_family(cfg: ExperimentConfig, families: Iterable[str]) -> list[tuple[str, str]]:
    import difflib

    known = list(families)
    if cfg.model.family in known:
        return []
    close = difflib.get_close_matches(cfg.model.family, known, n=1, cutoff=0.6)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return [("model.family", f"unknown model family {cfg.model.family!r}; known: "
                             f"{', '.join(known)}{hint}")]


def load_experiment_config(path: str | Path | None = None, overrides: Iterable[str] = (), *,
                           data: dict | None = None,
                           task_names: Iterable[str] | None = None,
                           families: Iterable[str] | None = None) -> ExperimentConfig:
    """Load, override and validate. Raises ``ConfigError`` naming every bad key.

    ``task_names`` / ``families``: the registries to check against (``vlp.tasks.task_names()``,
    ``vlp.models.list_families()``); the task registry and no family check by default, so
    that loading a config does not import the model zoo."""
    cfg = load_config(ExperimentConfig, path, overrides, data=data)
    if task_names is None:
        from vlp.tasks import task_names as registered_tasks

        task_names = registered_tasks()
    problems = check_task_names(cfg, task_names)
    if families is not None:
        problems += check_family(cfg, families)
    if problems:
        raise ConfigError(problems)
    return cfg
