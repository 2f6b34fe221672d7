"""The search space over pretraining configurations, and its Optuna define-by-run sampler.

    space = SearchSpace(tasks=["mlm", "itm", "mrfr", "mrc-kl"], ratios=[1, 2])
    check_space(space, "uniter-tiny")          # problems as (key, message); [] = fine
    sampler = SpaceSampler(space)              # OptunaSearch(space=sampler, ...)
    space.params_for(point)                    # the same point as Optuna params (warm start)

A point switches each candidate task on or off (a task that is on draws its mix ratio from
``ratios``), then picks masking, pretraining data and initialisation. Switching every task
off is the "no pretraining" point (finetune the initialisation only, Table 3 line 1), allowed
unless ``no_pretraining: false``; then at least one task is always on. Which tasks apply to
which model family comes from the model registry (region tasks need a region family, MVM
needs SOHO); the text-only MiniLM init needs a family sized like MiniLM.
"""

from __future__ import annotations

import dataclasses
import difflib
from typing import Annotated, Any, Literal

from pydantic import Field

from vlp.contract.config_loader import ConfigModel
from vlp.platform.sweep.point import TrialPoint
from vlp.tasks.registry import task_names, task_order


def _default_tasks() -> list[str]:
    return ["mlm", "itm", "mrc", "mrc-kl", "mrfr"]     # UNITER Table 3's tasks


class SearchSpace(ConfigModel):
    tasks: list[str] = Field(default_factory=_default_tasks)   # candidates, each on or off
    ratios: list[Annotated[float, Field(gt=0)]] = Field(default_factory=lambda: [1.0, 2.0])
    masking: list[Literal["conditional", "joint"]] = Field(
        default_factory=lambda: ["conditional", "joint"])
    data: list[Literal["in", "out", "both"]] = Field(default_factory=lambda: ["in", "out", "both"])
    # text: the text-only weights named by model.text_init (Table 3 lines 2-13 start there)
    init: list[Literal["random", "text"]] = Field(default_factory=lambda: ["random"])
    no_pretraining: bool = True        # the empty task set (finetune the init only) is a point
    # [] = the family's paper's objective for every point; else each point picks one: sampled
    # (one task per micro-batch, drawn by ratio) or summed (every task's loss on the same
    # examples, the ratios as loss weights scaled to a mean of 1)
    objective: list[Literal["sampled", "summed"]] = Field(default_factory=list)

    def validate(self):
        """Structure only; which tasks fit which family is ``check_space``."""
        for name in ("tasks", "ratios", "masking", "data", "init", "objective"):
            values = getattr(self, name)
            dup = sorted({str(v) for v in values if values.count(v) > 1})
            if dup:
                yield name, f"lists {', '.join(dup)} more than once"
        for name in ("ratios", "masking", "data", "init"):
            if not getattr(self, name):
                yield name, "is empty: the space needs at least one choice here"
        if not self.tasks and not self.no_pretraining:
            yield "tasks", ("the space is empty: no candidate task and no_pretraining is false "
                            "(list tasks, or allow the no-pretraining point)")

    # ---- membership ------------------------------------------------------------------------

    def ordered_tasks(self) -> list[str]:
        return sorted(self.tasks, key=lambda t: (task_order(t), t))

    def problems_with(self, point: TrialPoint, what: str) -> list[str]:
        """Why ``point`` is not in this space ([] when it is)."""
        out = []
        if not point.pretrains:
            if not self.no_pretraining:
                out.append(f"{what} has no pretraining, but space.no_pretraining is false")
        else:
            extra = [t for t, _ in point.tasks if t not in self.tasks]
            if extra:
                out.append(f"{what} needs task(s) {', '.join(extra)}, not in space.tasks")
            bad = sorted({r for _, r in point.tasks} - set(self.ratios))
            if bad:
                out.append(f"{what} uses mix ratio(s) {', '.join(f'{r:g}' for r in bad)}, "
                           f"not in space.ratios {[float(r) for r in self.ratios]}")
            if point.masking not in self.masking:
                out.append(f"{what} uses {point.masking} masking, not in space.masking")
            if point.data not in self.data:
                out.append(f"{what} pretrains on data {point.data!r}, not in space.data")
            if point.objective and point.objective not in (self.objective or [point.objective]):
                out.append(f"{what} uses the {point.objective} objective, not in "
                           f"space.objective")
        if point.init not in self.init:
            out.append(f"{what} starts from init {point.init!r}, not in space.init")
        return out

    def params_for(self, point: TrialPoint) -> dict[str, Any]:
        """The Optuna params ``SpaceSampler`` would record for ``point`` (for
        ``points_to_evaluate``); only parameters the sampler actually suggests."""
        params: dict[str, Any] = {}
        on = dict(point.tasks)
        tasks = self.ordered_tasks()
        for i, t in enumerate(tasks):
            if not _forced_on(i, tasks, list(params.values()), self.no_pretraining):
                params[f"task.{t}"] = t in on
        if len(self.ratios) > 1:
            params.update({f"ratio.{t}": float(on[t]) for t in tasks if t in on})
        if point.pretrains:
            for name in ("masking", "data", "objective"):
                if len(getattr(self, name)) > 1:
                    params[name] = getattr(point, name)
        if len(self.init) > 1:
            params["init"] = point.init
        return params

    def with_objective(self, point: TrialPoint) -> TrialPoint:
        """A named point in this space: the space's first objective where it lists any (a
        point without one would run at the family's, which the space may not hold)."""
        if not point.pretrains or point.objective or not self.objective:
            return point
        return dataclasses.replace(point, objective=self.objective[0])


def _forced_on(i: int, tasks: list[str], earlier_flags: list[Any], no_pretraining: bool) -> bool:
    """The last candidate is switched on without asking when every earlier one is off and
    the empty set is not allowed: the constraint "at least one task" holds by construction
    and the recorded Optuna params always match the trial's config."""
    return (not no_pretraining and i == len(tasks) - 1
            and not any(v is True for v in earlier_flags))


class SpaceSampler:
    """Optuna define-by-run function for ``OptunaSearch(space=...)``. A class instance, not a
    closure: the searcher pickles it with its state (``Tuner.restore``)."""

    def __init__(self, space: SearchSpace):
        self.space = space

    def __call__(self, trial: Any) -> dict[str, Any]:
        s = self.space
        tasks = s.ordered_tasks()
        on: list[str] = []
        flags: list[Any] = []
        for i, t in enumerate(tasks):
            if _forced_on(i, tasks, flags, s.no_pretraining):
                on.append(t)
                continue
            use = trial.suggest_categorical(f"task.{t}", [True, False])
            flags.append(use)
            if use:
                on.append(t)
        mix = {t: (float(s.ratios[0]) if len(s.ratios) == 1 else
                   float(trial.suggest_categorical(f"ratio.{t}", [float(r) for r in s.ratios])))
               for t in on}

        def pick(name: str, options: list[str]) -> str:
            return options[0] if len(options) == 1 else trial.suggest_categorical(name, options)

        kw = {}
        if on:
            kw = {"masking": pick("masking", list(s.masking)), "data": pick("data", list(s.data)),
                  "objective": pick("objective", list(s.objective)) if s.objective else ""}
        point = TrialPoint.of(mix, init=pick("init", list(s.init)), **kw)
        # Optuna's trial number names the trial (t001, ...): kept across Tuner.restore
        return {"point": point.to_params(), "trial_number": int(trial.number)}


# ---- the space against the model registry ------------------------------------------------------

def check_space(space: SearchSpace, family: str, key: str = "space",
                text_init: str = "auto") -> list[tuple[str, str]]:
    """Problems of ``space`` for model ``family``: unknown tasks, tasks that do not apply to
    the family, a text init the family cannot load."""
    problems = []
    for i, t in enumerate(space.tasks):
        problem = task_problem(t, family, task_names())
        if problem:
            problems.append((f"{key}.tasks.{i}", problem))
    if "text" in space.init:
        problem = init_problem("text", family, text_init)
        if problem:
            problems.append((f"{key}.init", problem))
    return problems


def task_problem(task: str, family: str, known: list[str]) -> str | None:
    from vlp.models.families import family_task_problem

    if task not in known:
        close = difflib.get_close_matches(task, known, n=1, cutoff=0.6)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        return f"unknown task {task!r}{hint}; known tasks: {', '.join(known)}"
    return family_task_problem(task, family)


def init_problem(init: str, family: str, text_init: str = "auto") -> str | None:
    """The text init (``model.text_init``): the packaged MiniLM weights load only into a
    transformer of MiniLM's size; ``bert:<path or URI>`` needs the file (its shapes are
    checked when a model is built)."""
    from vlp.models import FAMILIES, get_family
    from vlp.models.families import MINILM

    if init != "text":
        return None
    if text_init.startswith("bert:"):
        path = text_init[len("bert:"):]
        return None if path and _exists(path) else (
            f"the text init {text_init!r} (model.text_init) names no file or folder")
    t = get_family(family).transformer
    shape = ("hidden_size", "num_layers", "num_heads", "intermediate_size", "vocab_size")
    fits_minilm = all(getattr(t, k) == getattr(MINILM, k) for k in shape)
    if text_init in ("world-text", "auto") and not fits_minilm:
        return None if t.vocab_size == MINILM.vocab_size else (
            f"world-text init trains with the packaged {MINILM.vocab_size}-token vocabulary; "
            f"{family} has {t.vocab_size}")
    if fits_minilm:
        return None
    fits = [n for n, f in FAMILIES.items()
            if all(getattr(f.transformer, k) == getattr(MINILM, k) for k in shape)]
    return (f"the text init 'minilm' (MiniLM-L6-H384 weights, model.text_init) does not fit "
            f"{family} (hidden {t.hidden_size}, {t.num_layers} layers); families sized for it: "
            f"{', '.join(fits)}; or set model.text_init=bert:<path to BERT weights of "
            f"{family}'s size>")


def _exists(path: str) -> bool:
    """A local path, or a URI in shared storage (the sweep's text-init weights in s3://...)."""
    from vlp.platform.cluster.run_storage import location_exists

    return location_exists(path)


__all__ = ["SearchSpace", "SpaceSampler", "check_space", "task_problem", "init_problem"]
