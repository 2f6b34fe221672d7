"""A benchmark = its data adapter + its head and loss + its metric, registered by name.

Each benchmark file defines one :class:`Benchmark` subclass and registers it. The platform
(components, driver, commands) only talks to this interface:

- ``Options``: a typed config model of the benchmark's own settings (NLVR2 variant,
  retrieval loss…), loaded with the platform's typed config loader, so a typo is an error
  naming the key;
- ``defaults``: training steps, batch size and learning rate for the synthetic world;
- ``train_data`` / ``eval_data``: adapters from ``vlp.datasets.downstream``;
- ``build_head``: the head from ``vlp.models.heads`` (extending token types if needed);
- ``evaluate``: predictions spread over the workers, the metric on rank 0;
- ``meta_parts``: which metric enters Meta-Sum under which name (from ``meta_sum.PARTS``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
from torch import nn

from vlp.datasets.downstream import DownstreamDataConfig
from vlp.models import VLBackbone
from vlp.models.heads import DownstreamHead
from vlp.contract.config_loader import ConfigError, ConfigModel, from_dict
from vlp.benchmarks.eval_runner import EvalRunner
from vlp.benchmarks.meta_sum import parts_of


@dataclass(frozen=True)
class TrainDefaults:
    steps: int            # optimizer steps (per finetune)
    batch_size: int       # examples per worker per step
    lr: float


class NoOptions(ConfigModel):
    pass


@dataclass
class BenchmarkContext:
    """Everything a benchmark needs on a worker (picklable)."""
    data: DownstreamDataConfig
    options: Any
    family: Any                  # vlp.models.FamilyConfig
    eval_split: str = "val"
    seed: int = 0


@dataclass
class EvalResult:
    metrics: dict[str, float]                       # percentages, like UNITER's tables
    predictions: list[dict] = field(default_factory=list)   # one record per query
    notes: dict[str, str] = field(default_factory=dict)     # what the scores rest on, in words


class Benchmark:
    name: ClassVar[str]
    table: ClassVar[str]                            # the task table it reads (TASK_SCHEMAS)
    description: ClassVar[str]
    defaults: ClassVar[TrainDefaults]
    Options: ClassVar[type] = NoOptions
    primary: ClassVar[str]                          # the headline metric key
    # the token-type layout the head extends the table for (vlp.models.heads); a
    # checkpoint pretrained with it (UNITER's VCR second stage) loads into the extended table
    token_types: ClassVar[str | None] = None
    # the option that is the downstream protocol (head or loss) a family's paper fixes
    # (vlp.benchmarks.protocols); None: one protocol for every family
    protocol_option: ClassVar[str | None] = None

    @property
    def meta_parts(self) -> dict[str, str]:
        """Meta-Sum part → the metric key that scores it (empty outside Meta-Sum)."""
        return {p.name: p.metric for p in parts_of(self.name)}

    @property
    def task(self) -> str:
        """The name the training loop, the head and MLflow use: MLflow keys and folder names
        allow no '+' (``refcoco+`` → ``refcocoplus``)."""
        return task_id(self.name)

    def options(self, raw: dict[str, Any] | None, key: str = "") -> Any:
        """Typed options; ``ConfigError`` naming ``<key>.<option>`` for a bad one."""
        try:
            return from_dict(self.Options, dict(raw or {}))
        except ConfigError as e:
            raise ConfigError([(f"{key}.{k}" if key else k, m) for k, m in e.problems]) from None

    def protocol(self, options: Any) -> str:
        """The protocol these typed options choose ("" where the benchmark has one only)."""
        return str(getattr(options, self.protocol_option)) if self.protocol_option else ""

    def option_names(self) -> list[str]:
        return list(self.Options.model_fields)

    def check(self, ctx: BenchmarkContext) -> None:
        """Raise (naming the cause) when the benchmark cannot run with this model and data;
        called on the driver before any worker starts."""

    def train_data(self, ctx: BenchmarkContext) -> Any:
        raise NotImplementedError

    def eval_data(self, ctx: BenchmarkContext) -> Any:
        raise NotImplementedError

    def train_indices(self, data: Any) -> np.ndarray:
        """Rows of the training table that are training examples (all, by default)."""
        return np.arange(len(data))

    def build_head(self, ctx: BenchmarkContext, backbone: VLBackbone,
                   itm_head: nn.Linear | None) -> DownstreamHead:
        raise NotImplementedError

    def evaluate(self, ctx: BenchmarkContext, data: Any, runner: EvalRunner) -> EvalResult | None:
        """Rank 0 returns the result; other ranks return None."""
        raise NotImplementedError


def task_id(name: str) -> str:
    return name.replace("+", "plus")


def hidden_size(ctx: BenchmarkContext) -> int:
    return ctx.family.transformer.hidden_size


def layer_norm_eps(ctx: BenchmarkContext) -> float:
    return ctx.family.transformer.layer_norm_eps
