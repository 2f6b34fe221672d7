"""What each micro-batch trains, from the mix ratios: one task drawn per micro-batch
(``TaskSampler``, UNITER's meta-loader: the ``sampled`` objective) or every task of the mix on
the same examples (``SummedTasks``, ImageBERT and SOHO: the ``summed`` objective).

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
        _check_objective(state, "sampled")
        if int(state["seed"]) != self.seed or dict(state["mix"]) != self.mix:
            raise ValueError(f"task sampler state is for seed {state['seed']} and mix "
                             f"{dict(state['mix'])}, this sampler has seed {self.seed} and mix "
                             f"{self.mix}: resuming would draw a different task sequence")
        self.step = int(state["step"])


def loss_weights(mix: Mapping[str, float]) -> dict[str, float]:
    """The ``summed`` objective's loss weights: the positive mix ratios scaled to a mean of 1
    (equal ratios → weight 1 each, the papers' objective; 2:2:1:1 → 4/3, 4/3, 2/3, 2/3), so
    that a mix means the same under either objective: ratios are relative in both."""
    on = {t: float(r) for t, r in mix.items() if r > 0}
    total = sum(on.values())
    return {t: r * len(on) / total for t, r in on.items()}


class TaskSet(tuple):
    """The ``summed`` objective's draw: every task of the mix (a tuple of names, what the batch
    source reads) with its loss weight (what the loop reads), and the ``groups`` of tasks that
    share one batch and one forward (one masking per modality: VL-BERT's words and RoIs masked
    in the same example, ImageBERT's MOC and MRFR on one masked region set)."""

    weights: dict[str, float]
    groups: tuple[tuple[str, ...], ...]

    def __new__(cls, weights: Mapping[str, float],
                groups: Iterable[Iterable[str]] = ()) -> "TaskSet":
        obj = super().__new__(cls, weights)
        obj.weights = dict(weights)
        obj.groups = forward_groups(groups, obj.weights)
        return obj

    def __getnewargs__(self):   # pickle and copy rebuild it from the weights and groups
        return (self.weights, self.groups)

    def forwards(self) -> list[tuple[str, ...]]:
        """The set's forwards in task order: a group once (at its first member), every other
        task alone."""
        grouped = {t: g for g in self.groups for t in g}
        out: list[tuple[str, ...]] = []
        for t in self:
            g = grouped.get(t, (t,))
            if g not in out:
                out.append(g)
        return out


def forward_groups(groups: Iterable[Iterable[str]], mix: Iterable[str]
                   ) -> tuple[tuple[str, ...], ...]:
    """``groups`` restricted to the tasks of ``mix`` (in the group's own order: its first task
    of a modality draws that modality's mask); groups left with one task drop out. A task in
    two groups is an error naming it."""
    mix = set(mix)
    out: list[tuple[str, ...]] = []
    seen: set[str] = set()
    for g in groups:
        members = tuple(t for t in g if t in mix)
        for t in members:
            if t in seen:
                raise ValueError(f"train.forward_groups: task {t!r} is in two groups")
            seen.add(t)
        if len(members) > 1:
            out.append(members)
    return tuple(out)


class SummedTasks:
    """The ``summed`` objective's sampler: ``next()`` → every task with a positive ratio, as a
    tuple (the same each micro-batch): the batch source builds each task's batch from one
    example set and the loop sums ``weights[t] · loss_t``. ``groups``: tasks that share one
    batch and one forward (``TaskSet``)."""

    def __init__(self, mix: Mapping[str, float], seed: int = 0,
                 known: Iterable[str] | None = None,
                 groups: Iterable[Iterable[str]] = ()):
        self.mix = validate_mix(mix, known)
        self.seed = int(seed)
        self.step = 0
        self.weights = loss_weights(self.mix)
        self.groups = forward_groups(groups, self.weights)

    @property
    def tasks(self) -> list[str]:
        return list(self.weights)

    def next(self) -> TaskSet:
        self.step += 1
        return TaskSet(self.weights, self.groups)

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step, "seed": self.seed, "mix": dict(self.mix),
                "objective": "summed"}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        _check_objective(state, "summed")
        if dict(state["mix"]) != self.mix:
            raise ValueError(f"summed-objective state is for mix {dict(state['mix'])}, this "
                             f"run's mix is {self.mix}: the loss weights would change")
        self.step = int(state["step"])


def _check_objective(state: Mapping[str, Any], mine: str) -> None:
    saved = state.get("objective", "sampled")   # states before the objective existed: sampled
    if saved != mine:
        raise ValueError(f"the checkpoint's task sampler is for train.objective={saved}, this "
                         f"run has train.objective={mine}: resume with the same objective")
