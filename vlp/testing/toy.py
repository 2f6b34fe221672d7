"""TEST DOUBLE — not a product feature. A tiny learnable model, batch source and task sampler
that satisfy ``vlp.platform.training.protocols``, used by tests/test_platform_*.py to exercise the
training loop without the real models and data pipeline.

It lives in the package (not in tests/) only because Ray Train workers must import it:
pytest's test modules are not importable in a worker process.

The toy task: x ~ N(0, 1) of width ``dim``; classification tasks predict argmax(A x) over 4
classes, "mrfr" regresses B x. Batches have a random number of examples and a random
"length", so that examples and input units vary per batch as with UNITER's budgets.
Fault injection for the fault-tolerance tests: ``fail_at_call`` raises once (a marker file
makes it once per job, across worker restarts); ``nan_at_call`` returns a NaN batch;
``setup_error`` makes every model build fail alike (a set-up error, not a fault).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from vlp.contract import batch_spec as bs

REGRESSION_TASKS = ("mrfr",)
NUM_CLASSES = 4


class ToyModel(nn.Module):
    def __init__(self, tasks: list[str], dim: int = 16, hidden: int = 32):
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.LayerNorm(hidden),
                                   nn.Dropout(0.1))
        self.heads = nn.ModuleDict({
            t: nn.Linear(hidden, dim if t in REGRESSION_TASKS else NUM_CLASSES) for t in tasks})

    def forward(self, batch: dict[str, torch.Tensor], task: str) -> dict[str, torch.Tensor]:
        h = self.trunk(batch["x"])
        out = self.heads[task](h)
        if task in REGRESSION_TASKS:
            loss = nn.functional.mse_loss(out.float(), batch["y_reg"].float())
            return {"loss": loss, f"{task}_loss": loss}
        loss = nn.functional.cross_entropy(out.float(), batch["y_cls"])
        acc = (out.argmax(-1) == batch["y_cls"]).float().mean()
        return {"loss": loss, f"{task}_loss": loss, f"{task}_acc": acc}


class ToyTaskSampler:
    def __init__(self, mix: dict[str, float], seed: int):
        self.names = [t for t, r in mix.items() if r > 0]
        self.weights = [mix[t] for t in self.names]
        self.rng = random.Random(seed)

    def next(self) -> str:
        return self.rng.choices(self.names, weights=self.weights)[0]

    def state_dict(self) -> dict[str, Any]:
        return {"rng": self.rng.getstate()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rng.setstate(_as_tuple(state["rng"]))


class InOrderSampler:
    """A task sampler that draws ``tasks`` in turn (every task once, in a fixed order)."""

    def __init__(self, tasks):
        self.tasks, self.i = list(tasks), 0

    def next(self):
        task = self.tasks[self.i % len(self.tasks)]
        self.i += 1
        return task

    def state_dict(self) -> dict[str, Any]:
        return {"i": self.i}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.i = int(state["i"])


def _as_tuple(x: Any) -> Any:
    return tuple(_as_tuple(v) for v in x) if isinstance(x, (list, tuple)) else x


class ToyBatchSource:
    def __init__(self, dim: int, seed: int, rank: int, stage_index: int,
                 fail_at_call: int = 0, fail_rank: int = 1, fail_marker: str = "",
                 nan_at_call: int = 0, nan_rank: int = 0):
        # the same "world" (A, B) everywhere; per-rank, per-stage sample streams
        world = torch.Generator().manual_seed(1234)
        self.a = torch.randn(dim, NUM_CLASSES, generator=world)
        self.b = torch.randn(dim, dim, generator=world) / dim ** 0.5
        self.dim = dim
        self.rank = rank
        self.gen = torch.Generator().manual_seed(seed * 1000 + rank * 10 + stage_index)
        self.calls = 0
        self.fail_at_call, self.fail_rank, self.fail_marker = fail_at_call, fail_rank, fail_marker
        self.nan_at_call, self.nan_rank = nan_at_call, nan_rank

    def next(self, task: str | tuple[str, ...]) -> dict[str, Any]:
        self.calls += 1
        if (self.fail_at_call and self.calls == self.fail_at_call and self.rank == self.fail_rank
                and not Path(self.fail_marker).exists()):
            Path(self.fail_marker).write_text("injected\n")
            raise RuntimeError(f"toy: injected worker failure at batch {self.calls}")
        n = int(torch.randint(4, 17, (), generator=self.gen))
        length = int(torch.randint(8, 33, (), generator=self.gen))
        x = torch.randn(n, self.dim, generator=self.gen)
        if self.nan_at_call and self.calls == self.nan_at_call and self.rank == self.nan_rank:
            x[0, 0] = float("nan")
        batch = {"x": x, "y_cls": (x @ self.a).argmax(-1), "y_reg": x @ self.b,
                 bs.NUM_EXAMPLES: torch.tensor(n), bs.INPUT_UNITS: torch.tensor(n * length)}
        if isinstance(task, tuple):   # the summed objective: every task on the same examples
            return {bs.TASK_BATCHES: {t: batch for t in task},
                    bs.NUM_EXAMPLES: batch[bs.NUM_EXAMPLES], bs.INPUT_UNITS: batch[bs.INPUT_UNITS]}
        return batch

    def state_dict(self) -> dict[str, Any]:
        return {"gen": self.gen.get_state(), "calls": self.calls}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.gen.set_state(state["gen"])
        self.calls = int(state["calls"])


class GlobalToyStream:
    """A toy batch source over one global stream of micro-batches: micro-batch ``g`` of a
    stage (its examples, ids ``g * 100 + i``, under ``example_id``) comes from (seed, stage,
    g) alone, and of ``world`` workers rank r serves g = r, r + world, r + 2·world, … Its state
    is the next g; ``load_resharded_state`` continues the global stream on another number of
    workers: the union of the micro-batches served stays 0, 1, 2, … with none skipped or
    served twice, whatever the workers before and after."""

    def __init__(self, dim: int, seed: int, rank: int, world: int, stage_index: int):
        world_gen = torch.Generator().manual_seed(1234)
        self.a = torch.randn(dim, NUM_CLASSES, generator=world_gen)
        self.b = torch.randn(dim, dim, generator=world_gen) / dim ** 0.5
        self.dim, self.seed, self.stage = dim, seed, stage_index
        self.rank, self.world = rank, world
        self.g = rank

    def next(self, task: str | tuple[str, ...]) -> dict[str, Any]:
        gen = torch.Generator().manual_seed((self.seed * 7919 + self.stage) * 1_000_003 + self.g)
        n = int(torch.randint(4, 17, (), generator=gen))
        length = int(torch.randint(8, 33, (), generator=gen))
        x = torch.randn(n, self.dim, generator=gen)
        batch = {"x": x, "y_cls": (x @ self.a).argmax(-1), "y_reg": x @ self.b,
                 "example_id": torch.arange(n) + self.g * 100,
                 bs.NUM_EXAMPLES: torch.tensor(n), bs.INPUT_UNITS: torch.tensor(n * length)}
        self.g += self.world
        if isinstance(task, tuple):
            return {bs.TASK_BATCHES: {t: batch for t in task},
                    bs.NUM_EXAMPLES: batch[bs.NUM_EXAMPLES], bs.INPUT_UNITS: batch[bs.INPUT_UNITS]}
        return batch

    def state_dict(self) -> dict[str, Any]:
        return {"next": self.g}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.g = int(state["next"])

    def load_resharded_state(self, states: list[dict[str, Any]], saved_world: int) -> None:
        """Rank r of ``saved_world`` stood at its next g = cursor + r, the cursor being the
        micro-batches all of them served (the same count each: at a step boundary)."""
        cursors = {int(s["next"]) - r for r, s in enumerate(states)}
        if len(cursors) != 1 or len(states) != saved_world:
            raise ValueError(f"toy stream: the {saved_world} saved positions "
                             f"{[s['next'] for s in states]} are not one global cursor")
        self.g = cursors.pop() + self.rank


@dataclass
class ToyComponents:
    """``vlp.platform.training.protocols.Components`` for the toy world."""

    dim: int = 16
    fail_at_call: int = 0       # batch number (per worker, per stage) that raises once
    fail_rank: int = 1
    fail_marker: str = ""       # absolute path; its existence means "already failed"
    nan_at_call: int = 0        # batch number that carries a NaN (on nan_rank)
    nan_rank: int = 0
    setup_error: str = ""       # build_model raises ValueError(this): a deterministic error
    attempts_file: str = ""     # absolute path; build_model appends a line per call
    global_stream: bool = False  # GlobalToyStream: one global stream, resumable on any world

    def datasets(self, cfg: Any) -> None:
        return None

    def build_model(self, cfg: Any, tasks: list[str]) -> nn.Module:
        if self.attempts_file:
            with open(self.attempts_file, "a") as f:
                f.write("build_model\n")
        if self.setup_error:
            raise ValueError(self.setup_error)
        return ToyModel(tasks, dim=self.dim)

    def build_batch_source(self, cfg: Any, stage: Any, stage_index: int,
                           worker: Any) -> ToyBatchSource | GlobalToyStream:
        if self.global_stream:
            return GlobalToyStream(self.dim, worker.seed, worker.rank, worker.world_size,
                                   stage_index)
        return ToyBatchSource(self.dim, worker.seed, worker.rank, stage_index,
                              self.fail_at_call, self.fail_rank, self.fail_marker,
                              self.nan_at_call, self.nan_rank)

    def build_task_sampler(self, mix: dict[str, float], seed: int) -> ToyTaskSampler:
        return ToyTaskSampler(mix, seed)
