"""The finetuning config: which checkpoint, which world, which benchmarks, how to train.

    cfg = load_finetune_config("jobs/configs/finetune.yaml",
                               overrides=["benchmarks=[vqa,nlvr2]",
                                          "settings.nlvr2.options.variant=pair"])

Per-benchmark settings (``settings.<benchmark>``) override the benchmark's defaults (steps,
batch size, learning rate) and carry its own options, checked by the benchmark's typed
options class: an unknown benchmark, setting or option is an error naming its key.

``protocol`` picks the head or loss of retrieval, NLVR2 and RefCOCO+ an option left unset
takes: ``family`` (default) = the model family's paper's (ImageBERT: binary retrieval; SOHO:
in-batch binary retrieval and the NLVR2 pair set-up; VL-BERT: a binary loss per RoI on
RefCOCO+; ``vlp.benchmarks.protocols``), ``uniter`` = UNITER's for every family.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Iterable, Literal

from pydantic import Field

from vlp.contract.config_loader import ConfigError, ConfigModel, load_config
from vlp.platform.pretrain.experiment_config import ScalingSection, _NAME
from vlp.benchmarks import BENCHMARKS, UnknownBenchmark, get_benchmark
from vlp.benchmarks import meta_sum, protocols

META_SUM_BENCHMARKS = list(meta_sum.BENCHMARKS)   # UNITER Table 3
# The benchmarks' default lrs are UNITER-base's, tuned at hidden width 768. With Adam the step
# a hidden matrix can take shrinks as the model widens (muP, Yang et al. 2021), and at BERT-base
# lrs a 64-wide model underfits its finetunes: a default lr is scaled by 768 / width (-tiny x12,
# -minilm x2, large x0.75). Measured on uniter-tiny from a fresh init (demo world, seed 0), the
# scaled defaults lift RefCOCO+ 29 -> 71, VQA 45 -> 48, VE 67 -> 74, VCR Q->AR 22 -> 26. An lr
# set in ``settings`` is taken as given.
DEFAULT_LR_WIDTH = 768
_Beta = Annotated[float, Field(ge=0, lt=1)]


def default_lr_scale(family: str) -> float:
    """What a benchmark's default lr is multiplied by for ``family``."""
    from vlp.models import FAMILIES

    return DEFAULT_LR_WIDTH / FAMILIES[family].transformer.hidden_size


class FtRunSection(ConfigModel):
    name: str = "finetune"         # runs are <output_dir>/<name>-<benchmark>
    output_dir: str = "runs"
    # the finetune runs' storage (folder or URI); "" = $VLP_STORAGE, else output_dir
    storage: str = ""
    seed: int = Field(0, ge=0)
    max_failures: int = Field(0, ge=-1)

    def validate(self):
        if not _NAME.match(self.name):
            yield "name", (f"expected letters, digits, '_', '.', '-' (a folder name), "
                           f"got {self.name!r}")


class FtModelSection(ConfigModel):
    family: str = "uniter-tiny"
    # checkpoint: pretrained weights from ``checkpoint``; random: no pretraining (UNITER Table 3
    # line 1); minilm: the packaged text-only BERT weights (Table 3 line 2)
    init: Literal["checkpoint", "random", "minilm"] = "checkpoint"
    checkpoint: str = ""           # a pretraining checkpoint / run folder / state-dict file
    tokenizer: str = ""            # folder or file; "" = the packaged uncased vocab
    # SOHO (§4.2: "using input features of the VD module for visual representation is better
    # than directly applying VD embedding. We adopt the former"): features = the grid
    # features entering the visual dictionary, dictionary = its quantised tokens (as in
    # pre-training); and whether the dictionary's moving average runs while finetuning
    visual_tokens: Literal["features", "dictionary"] = "features"
    dictionary_updates: bool = False

    def validate(self):
        from vlp.models import FAMILIES

        if self.family not in FAMILIES:
            yield "family", f"unknown model family {self.family!r}; known: {', '.join(FAMILIES)}"
        elif FAMILIES[self.family].visual.kind != "soho":
            if self.visual_tokens != "features":
                yield "visual_tokens", (f"{self.visual_tokens!r} is SOHO's visual-dictionary "
                                        f"switch; {self.family} has no dictionary")
            if self.dictionary_updates:
                yield "dictionary_updates", f"SOHO only: {self.family} has no visual dictionary"
        if self.init == "checkpoint" and not self.checkpoint:
            yield "checkpoint", "required with model.init: checkpoint (or set model.init: random)"
        if self.init != "checkpoint" and self.checkpoint:
            yield "checkpoint", f"only used with model.init: checkpoint (init is {self.init!r})"


class BenchmarkSettings(ConfigModel):
    steps: int = Field(0, ge=0)          # 0 = the benchmark's default
    batch_size: int = Field(0, ge=0)     # examples per worker per step; 0 = default
    lr: float = Field(0.0, ge=0)         # 0 = default
    options: dict[str, Any] = Field(default_factory=dict)


class FtTrainSection(ConfigModel):
    steps_scale: float = Field(1.0, gt=0)        # multiplies every benchmark's steps
    warmup_fraction: float = Field(0.1, ge=0, lt=1)
    weight_decay: float = Field(0.01, ge=0)
    betas: tuple[_Beta, _Beta] = (0.9, 0.98)
    grad_clip: float = Field(2.0, ge=0)          # UNITER finetuning clips at 2.0
    dropout: float = Field(0.1, ge=0, lt=1)      # backbone hidden/attention dropout
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"   # auto: bf16 on GPU
    zero_stage: Literal["auto", 0, 1, 2] = "auto"   # auto: engine.zero_stage (1 by default)
    log_every: int = Field(50, gt=0)
    extensions_dir: str = ""


class FtEvalSection(ConfigModel):
    split: Literal["val", "test"] = "val"          # UNITER Table 3 reports val / dev splits
    batch_size: int = Field(128, gt=0)           # rows per forward pass


class FtMlflowSection(ConfigModel):
    enabled: bool = True
    tracking_uri: str = ""     # "" = the pretraining run's store if found, else the embedded one
    experiment: str = "vlp-finetune"   # used when there is no parent run to nest under
    parent_run_id: str = ""    # "" = the run that wrote the checkpoint, when it can be found
    check_timeout_s: float = Field(3.0, gt=0)


class FinetuneConfig(ConfigModel):
    run: FtRunSection = Field(default_factory=FtRunSection)
    model: FtModelSection = Field(default_factory=FtModelSection)
    world: str = ""                # a vlp world folder (manifest.json), or its URI (s3://...)
    benchmarks: list[str] = Field(default_factory=lambda: list(META_SUM_BENCHMARKS))
    protocol: Literal["family", "uniter"] = "family"   # see the module
    settings: dict[str, BenchmarkSettings] = Field(default_factory=dict)
    train: FtTrainSection = Field(default_factory=FtTrainSection)
    eval: FtEvalSection = Field(default_factory=FtEvalSection)
    scaling: ScalingSection = Field(default_factory=lambda: ScalingSection(num_workers=1))
    mlflow: FtMlflowSection = Field(default_factory=FtMlflowSection)

    def validate(self):
        if not self.world:
            yield "world", "expected a world folder (with manifest.json)"
        if not self.benchmarks:
            yield "benchmarks", f"expected at least one of {', '.join(BENCHMARKS)}"
        for i, name in enumerate(self.benchmarks):
            try:
                get_benchmark(name)
            except UnknownBenchmark as e:
                yield f"benchmarks.{i}", str(e)
        if len(set(self.benchmarks)) != len(self.benchmarks):
            yield "benchmarks", f"a benchmark is listed twice: {self.benchmarks}"
        if self.train.precision == "fp16" and not self.scaling.use_gpu:
            yield "train.precision", ("fp16 is not supported on CPU (DeepSpeed refuses it): "
                                      "use bf16 or fp32, or set scaling.use_gpu=true")
        for name, s in self.settings.items():
            if name not in BENCHMARKS:
                yield f"settings.{name}", f"unknown benchmark; known: {', '.join(BENCHMARKS)}"
                continue
            try:
                self.options_for(name)
            except ConfigError as e:
                yield from e.problems

    # ---- per benchmark ------------------------------------------------------------------

    def settings_for(self, name: str) -> tuple[int, int, float, Any]:
        """(steps, batch size, lr, typed options) of one benchmark, defaults filled in."""
        bench = get_benchmark(name)
        s = self.settings.get(name, BenchmarkSettings())
        steps = max(1, round((s.steps or bench.defaults.steps) * self.train.steps_scale))
        lr = s.lr or bench.defaults.lr * default_lr_scale(self.model.family)
        return steps, s.batch_size or bench.defaults.batch_size, lr, self.options_for(name)

    def options_for(self, name: str) -> Any:
        """One benchmark's typed options: the protocol's (``protocol``) under the ones set."""
        s = self.settings.get(name, BenchmarkSettings())
        base = protocols.options_for(name, self.model.family, self.protocol)
        return get_benchmark(name).options({**base, **s.options}, f"settings.{name}.options")

    def protocol_of(self, name: str) -> tuple[str, str]:
        """(the protocol ``name`` is finetuned with, where it comes from); ("", "") for a
        benchmark with one protocol only."""
        bench = get_benchmark(name)
        label = bench.protocol(self.options_for(name))
        if not label:
            return "", ""
        s = self.settings.get(name, BenchmarkSettings())
        return label, protocols.source(name, self.model.family, self.protocol, s.options)

    def resolved_paths(self) -> "FinetuneConfig":
        from vlp.platform.cluster.run_storage import is_uri

        def absolute(p: str) -> str:   # a URI (s3://...) stays as it is
            return str(Path(p).expanduser().resolve()) if p and not is_uri(p) else p
        return self.model_copy(update=dict(
            world=absolute(self.world),
            run=self.run.model_copy(update=dict(output_dir=absolute(self.run.output_dir))),
            model=self.model.model_copy(update=dict(
                checkpoint=absolute(self.model.checkpoint),
                tokenizer=absolute(self.model.tokenizer)))))


def load_finetune_config(path: str | Path | None = None, overrides: Iterable[str] = (), *,
                         data: dict | None = None) -> FinetuneConfig:
    """Load, override and validate; ``ConfigError`` names every bad key."""
    return load_config(FinetuneConfig, path, overrides, data=data)
