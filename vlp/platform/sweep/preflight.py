"""Everything a sweep checks before its first trial starts; every problem is raised at once
as one ``ConfigError`` naming its key.

- the model family exists; the replay exists and each of its lines applies to the family, or
  the space's tasks and init apply to it (model registry), and the ``include`` points exist
  and lie in the space;
- the world loads and has sources for every data choice the sweep can draw;
- every pretraining config a trial can run builds and plans (``pretrain_data.prepare``:
  source folders, shard footers, soft labels for the region tasks) — each replay line, or for
  a search one point per (data, masking, init) with every candidate task on;
- the finetune settings load for every benchmark and the world's task tables are complete;
- the MLflow store is reachable.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from vlp.contract.config_loader import ConfigError
from vlp.platform.sweep.sweep_config import SweepConfig
from vlp.platform.sweep.point import TrialPoint
from vlp.platform.sweep.replays import NAMED_POINTS, check_replay, named_point, replay_lines
from vlp.platform.sweep.space import check_space
from vlp.platform.sweep.trial_configs import (DOMAIN_OF_CHOICE, configs_of, data_sources,
                                              finetune_config)


@dataclass(frozen=True)
class SweepPlan:
    """What the sweep will run: named lines (replay) or the points to evaluate first."""
    lines: tuple[tuple[str, TrialPoint], ...] = ()        # replay: (line, point)
    first: tuple[tuple[str, TrialPoint], ...] = ()        # search: (include name, point)


def check_sweep(cfg: SweepConfig) -> SweepPlan:
    """``cfg`` must be ``resolved()``. Raises ``ConfigError`` with every problem found."""
    from vlp.models import list_families

    if cfg.model.family not in list_families():
        import difflib

        close = difflib.get_close_matches(cfg.model.family, list_families(), n=1, cutoff=0.6)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError([("model.family", f"unknown model family {cfg.model.family!r}{hint}; "
                                            f"known: {', '.join(list_families())}")])
    plan, problems = _points(cfg)
    if problems:
        raise ConfigError(problems)
    points = [p for _, p in plan.lines] or _probe_points(cfg)
    problems += _world_problems(cfg, points)
    if problems:
        raise ConfigError(problems)
    problems += _pretrain_problems(cfg, list(plan.lines) or
                                   [(f"probe{i}", p) for i, p in enumerate(points)])
    problems += _finetune_problems(cfg)   # both: every problem at once
    if problems:
        raise ConfigError(problems)
    from vlp.platform.tracking.mlflow_run import check_reachable

    check_reachable(cfg.mlflow.tracking_uri, cfg.mlflow.check_timeout_s)
    return plan


def _points(cfg: SweepConfig) -> tuple[SweepPlan, list[tuple[str, str]]]:
    family = cfg.model.family
    if cfg.sweep.replay:
        problems = check_replay(cfg.sweep.replay, family, text_init=cfg.model.text_init)
        if problems:
            return SweepPlan(), problems
        lines = replay_lines(cfg.sweep.replay)
        known = [l.name for l in lines]
        unknown = [n for n in cfg.sweep.lines if n not in known]
        if unknown:
            return SweepPlan(), [("sweep.lines", f"{cfg.sweep.replay} has no line "
                                  f"{', '.join(unknown)}; its lines: {', '.join(known)}")]
        chosen = [l for l in lines if not cfg.sweep.lines or l.name in cfg.sweep.lines]
        return SweepPlan(lines=tuple((l.name, l.point) for l in chosen)), []
    problems = check_space(cfg.space, family, text_init=cfg.model.text_init)
    first = []
    for i, name in enumerate(cfg.sweep.include):
        key = f"sweep.include.{i}"
        if name not in NAMED_POINTS:
            problems.append((key, f"unknown point {name!r}; known: {', '.join(NAMED_POINTS)}"))
            continue
        point = cfg.space.with_objective(
            named_point(name, cfg.space.init[0] if cfg.space.init else "random"))
        why = cfg.space.problems_with(point, f"point {name!r} ({point.describe()})")
        problems += [(key, f"contradicts the space: {w}") for w in why]
        first.append((name, point))
    return SweepPlan(first=tuple(first)), problems


def _probe_points(cfg: SweepConfig) -> list[TrialPoint]:
    """A search: one point per (data, masking, init) with every candidate task on (ratio:
    the first choice), plus the no-pretraining point per init when the space has it."""
    s = cfg.space
    mix = {t: float(s.ratios[0]) for t in s.tasks}
    out = [TrialPoint.of(mix, masking=m, data=d, init=i, objective=o)
           for d, m, i, o in itertools.product(s.data, s.masking, s.init, s.objective or [""])
           ] if mix else []
    if s.no_pretraining:
        out += [TrialPoint(init=i) for i in s.init]
    return out


def _world_problems(cfg: SweepConfig, points: list[TrialPoint]) -> list[tuple[str, str]]:
    from vlp.datasets.storage.world import WorldError, load_manifest

    try:
        load_manifest(cfg.world)
    except WorldError as e:
        return [("world", str(e))]
    problems = []
    key = "space.data" if not cfg.sweep.replay else "sweep.replay"
    for choice in sorted({p.data for p in points if p.pretrains}):
        if not data_sources(cfg.world, choice):
            domains = " and ".join(f"{d}-domain" for d in DOMAIN_OF_CHOICE[choice])
            problems.append((key, f"data {choice!r} needs {domains} pretraining sources; the "
                                  f"world {cfg.world} has none"))
    return problems


def _pretrain_problems(cfg: SweepConfig, named: list[tuple[str, TrialPoint]]
                       ) -> list[tuple[str, str]]:
    from vlp.platform.pretrain.data import prepare

    problems: list[tuple[str, str]] = []
    seen = set()
    for name, point in named:
        sig = (point.tasks, point.data, point.masking, point.init)
        if not point.pretrains or sig in seen:
            continue
        seen.add(sig)
        try:
            (_, _, exp), = configs_of(cfg, [(name, point)])
            prepare(exp)
        except ConfigError as e:
            problems += [(_pretrain_key(k), f"{msg} (trial {name}: {point.describe()})")
                         for k, msg in e.problems]
    # one line per cause: the same bad setting shows in every point's config
    first: dict[str, tuple[str, str]] = {}
    for key, msg in problems:
        first.setdefault(f"{key}\0{msg.split(' (trial ')[0]}", (key, msg))
    return list(first.values())


def _pretrain_key(key: str) -> str:
    """A pretraining config key as the sweep config names it."""
    head = key.split(".", 1)[0]
    if head == "tasks":
        return "space.tasks"
    if key.startswith("data.sources"):
        return "world"
    return f"pretrain.{key}"


def _finetune_problems(cfg: SweepConfig) -> list[tuple[str, str]]:
    from vlp.datasets.downstream import DownstreamDataError
    from vlp.platform.finetune.preflight import prepare

    problems: list[tuple[str, str]] = []
    ft = None
    for i, bench in enumerate(cfg.finetune.benchmarks):
        try:
            ft = finetune_config(cfg, TrialPoint(), bench, str(cfg.sweep_dir / "trials" / "check"))
        except ConfigError as e:
            for k, msg in e.problems:
                key = f"finetune.benchmarks.{i}" if k.startswith("benchmarks") else \
                    f"finetune.overrides ({k})"
                problems.append((key, msg))
    if problems or ft is None:
        return list(dict.fromkeys(problems))
    try:
        prepare(ft.model_copy(update=dict(benchmarks=list(cfg.finetune.benchmarks))))
    except (DownstreamDataError, ValueError) as e:
        problems.append(("world", f"finetuning data: {e}"))
    return problems
