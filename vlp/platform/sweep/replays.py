"""Replays: named grids of points that reproduce a paper's ablation, registered by name.

    lines = replay_lines("table3")      # [Line("L01", TrialPoint(), "None / None"), ...]
    check_replay("table3", "uniter-minilm")   # problems; [] = every line runs on the family

``table3`` is UNITER's Table 3 (13 lines). Lines 3-13 start from the text-only init of line
2, as in the paper ("we use the pre-trained weights in L2 to initialize our model for the
following experiments"); mix ratios are MLM and ITM 2, each region task 1. The paper states
no task ratio: 2:2:1:1 comes from the reference code's pretraining configs (UNITER's in-domain
config, REFERENCE_NOTES.md), which is what a replay of its runs has to go on.

``NAMED_POINTS`` are the points a search can be asked to evaluate first (``include``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

from vlp.platform.sweep.point import TrialPoint
from vlp.platform.sweep.space import init_problem, task_problem


@dataclass(frozen=True)
class Line:
    name: str            # L01 ... (folder- and run-name safe)
    point: TrialPoint
    paper: str           # the row as the paper labels it


def _uniter(*tasks: str, **kw) -> TrialPoint:
    ratio = {"mlm": 2.0, "itm": 2.0}
    return TrialPoint.of({t: ratio.get(t, 1.0) for t in tasks}, init="text", **kw)


_BEST = ("mlm", "itm", "mrc-kl", "mrfr")


def table3() -> list[Line]:
    rows = [
        (TrialPoint(), "None"),
        (TrialPoint(init="text"), "Text: MLM (BERT init, no V+L pretraining)"),
        (_uniter("mrfr"), "In-domain: MRFR"),
        (_uniter("itm"), "In-domain: ITM"),
        (_uniter("mlm"), "In-domain: MLM"),
        (_uniter("mlm", "itm"), "In-domain: MLM + ITM"),
        (_uniter("mlm", "itm", "mrc"), "In-domain: MLM + ITM + MRC"),
        (_uniter("mlm", "itm", "mrfr"), "In-domain: MLM + ITM + MRFR"),
        (_uniter("mlm", "itm", "mrc-kl"), "In-domain: MLM + ITM + MRC-kl"),
        (_uniter(*_BEST), "In-domain: MLM + ITM + MRC-kl + MRFR"),
        (_uniter(*_BEST, masking="joint"), "In-domain: MLM + ITM + MRC-kl + MRFR (w/o cond. mask)"),
        (_uniter(*_BEST, data="out"), "Out-of-domain: MLM + ITM + MRC-kl + MRFR"),
        (_uniter(*_BEST, data="both"), "In-domain + Out-of-domain: MLM + ITM + MRC-kl + MRFR"),
    ]
    return [Line(f"L{i:02d}", p, label) for i, (p, label) in enumerate(rows, 1)]


REPLAYS: dict[str, Callable[[], list[Line]]] = {"table3": table3}


def replay_lines(name: str) -> list[Line]:
    try:
        return REPLAYS[name]()
    except KeyError:
        raise ValueError(f"unknown replay {name!r}; known replays: {', '.join(REPLAYS)}") from None


def check_replay(name: str, family: str, key: str = "sweep.replay",
                 text_init: str = "auto") -> list[tuple[str, str]]:
    """Every line's tasks and init must apply to ``family``; one problem per cause, naming
    the lines it affects."""
    from vlp.tasks import task_names

    if name not in REPLAYS:
        import difflib

        close = difflib.get_close_matches(name, list(REPLAYS), n=1, cutoff=0.5)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        return [(key, f"unknown replay {name!r}{hint}; known replays: {', '.join(REPLAYS)}")]
    causes: dict[str, list[str]] = {}
    for line in replay_lines(name):
        found = [task_problem(t, family, task_names()) for t, _ in line.point.tasks]
        found.append(init_problem(line.point.init, family, text_init))
        for p in filter(None, found):
            causes.setdefault(p, []).append(line.name)
    return [(key, f"{name} lines {', '.join(lines)}: {p}") for p, lines in causes.items()]


# ---- points a search evaluates first ------------------------------------------------------------

def _paper_best(init: str) -> TrialPoint:
    return replace(_uniter(*_BEST), init=init)


# name → point given the space's first init (the demo's uniter-tiny has only "random")
NAMED_POINTS: dict[str, Callable[[str], TrialPoint]] = {
    "none": lambda init: TrialPoint(init="random"),          # Table 3 L1
    "text-init": lambda init: TrialPoint(init="text"),       # Table 3 L2
    "paper-best": _paper_best,                               # Table 3 L10's mix
}


def named_point(name: str, init: str) -> TrialPoint:
    try:
        return NAMED_POINTS[name](init)
    except KeyError:
        raise ValueError(f"unknown point {name!r}; known: {', '.join(NAMED_POINTS)}") from None
