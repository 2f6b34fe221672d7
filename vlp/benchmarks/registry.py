"""The benchmarks by the name users type, loaded on first use.

Each benchmark file registers its class (``@register``); ``load_all`` imports the files the
first time the registry is read, so that importing the package (for ``meta_sum``, say) does
not import torch and the data adapters.
"""

from __future__ import annotations

import difflib
from importlib import import_module
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vlp.benchmarks.base import Benchmark

# one module per benchmark (refcoco_plus.py registers refcoco+ and refcoco+-gt)
MODULES = ("nlvr2", "refcoco_plus", "retrieval", "vcr", "ve", "vqa")

BENCHMARKS: dict[str, Benchmark] = {}
_loaded = False


class UnknownBenchmark(ValueError):
    """A benchmark name that is not registered."""


def register(cls: type[Benchmark]) -> type[Benchmark]:
    if cls.name in BENCHMARKS:
        raise ValueError(f"benchmark {cls.name!r} registered twice")
    BENCHMARKS[cls.name] = cls()
    return cls


def load_all() -> dict[str, Benchmark]:
    """Every benchmark, by name in alphabetical order (lists and error messages read the
    same whichever benchmark file happened to be imported first)."""
    global _loaded
    if not _loaded:
        for module in MODULES:
            import_module(f"vlp.benchmarks.{module}")
        ordered = sorted(BENCHMARKS.items())
        BENCHMARKS.clear()
        BENCHMARKS.update(ordered)
        _loaded = True
    return BENCHMARKS


def get_benchmark(name: str) -> Benchmark:
    load_all()
    try:
        return BENCHMARKS[name]
    except KeyError:
        close = difflib.get_close_matches(name, list(BENCHMARKS), n=1, cutoff=0.5)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise UnknownBenchmark(f"unknown benchmark {name!r}{hint}; known: "
                               f"{', '.join(BENCHMARKS)}") from None
