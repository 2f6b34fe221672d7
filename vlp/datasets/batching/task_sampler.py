"""One pretraining task per step, drawn from the mix ratios (UNITER's meta-loader).

The draw for step ``s`` is a pure function of ``(seed, s)``: every rank draws the same task
without communicating, and resuming needs only the step counter, so a restored sampler
continues with exactly the draws an uninterrupted run would have made.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Iterator, Mapping

import numpy as np

from vlp.datasets.stream.data_config import DataConfigError


def mix_problems(mix: Mapping[str, Any], known: Iterable[str], key: str = "tasks"
                 ) -> list[tuple[str, str]]:
    """Every problem of a task mix, each naming its key (``tasks.mrfr``)."""
    import difflib

    known = list(known)
    problems: list[tuple[str, str]] = []
    if not isinstance(mix, Mapping) or not mix:
        return [(key, f"expected a mapping task → ratio with at least one task, got {mix!r}")]
    for name, ratio in mix.items():
        if name not in known:
            close = difflib.get_close_matches(str(name), known, n=1, cutoff=0.6)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            problems.append((f"{key}.{name}", f"unknown task {name!r}{hint}; known tasks: "
                                              f"{', '.join(known)}"))
        if (not isinstance(ratio, (int, float)) or isinstance(ratio, bool)
                or not math.isfinite(ratio) or ratio < 0):
            problems.append((f"{key}.{name}", f"expected a mix ratio ≥ 0, got {ratio!r}"))
    if not problems and all(r == 0 for r in mix.values()):
        problems.append((key, "all mix ratios are 0: at least one task must be positive"))
    return problems


def validate_mix(mix: Mapping[str, Any], known: Iterable[str] | None = None,
                 key: str = "tasks") -> dict[str, float]:
    """The mix as ``{task: float}``; raises ``DataConfigError`` naming every bad key.
    ``known`` defaults to the task registry."""
    if known is None:
        from vlp.tasks import task_names
        known = task_names()
    problems = mix_problems(mix, known, key)
    if problems:
        raise DataConfigError(problems)
    return {k: float(v) for k, v in mix.items()}


class TaskSampler:
    """``next()`` → the task of the current step. Identical on every rank for one seed."""

    def __init__(self, mix: Mapping[str, float], seed: int = 0,
                 known: Iterable[str] | None = None):
        self.mix = validate_mix(mix, known)
        self.seed = int(seed)
        self.step = 0
        names = [t for t, r in self.mix.items() if r > 0]   # zero ratio = never drawn
        ratios = np.array([self.mix[t] for t in names], dtype=np.float64)
        self._names = names
        self._cdf = np.cumsum(ratios / ratios.sum())
        self._cdf[-1] = 1.0

    @property
    def tasks(self) -> list[str]:
        """Tasks that can be drawn (positive ratio): the model needs a head for each."""
        return list(self._names)

    def draw(self, step: int) -> str:
        """The task of ``step`` (pure: does not advance the sampler)."""
        u = np.random.default_rng([self.seed, int(step)]).random()
        return self._names[int(np.searchsorted(self._cdf, u, side="right"))]

    def next(self) -> str:
        task = self.draw(self.step)
        self.step += 1
        return task

    def __iter__(self) -> Iterator[str]:
        while True:
            yield self.next()

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step, "seed": self.seed, "mix": dict(self.mix)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if int(state["seed"]) != self.seed or dict(state["mix"]) != self.mix:
            raise ValueError(f"task sampler state is for seed {state['seed']} and mix "
                             f"{dict(state['mix'])}, this sampler has seed {self.seed} and mix "
                             f"{self.mix}: resuming would draw a different task sequence")
        self.step = int(state["step"])
