"""Downstream benchmarks, one file each under the name users type (vqa, retrieval, nlvr2, ve,
refcoco+ in refcoco_plus.py, vcr): its options, head, training defaults and metric.
``meta_sum.py`` holds the one list of Meta-Sum parts; ``base.py`` the interface;
``registry.py`` the benchmarks by name.

The names below load on first use: importing ``vlp.benchmarks.meta_sum`` (the leaderboard
does) stays free of torch; reading the registry imports every benchmark file.
"""

from __future__ import annotations

from typing import Any

_FROM_REGISTRY = ("BENCHMARKS", "UnknownBenchmark", "get_benchmark")
_FROM_BASE = ("Benchmark", "BenchmarkContext", "EvalResult", "TrainDefaults", "task_id")

__all__ = [*_FROM_REGISTRY, *_FROM_BASE]


def __getattr__(name: str) -> Any:
    if name in _FROM_REGISTRY:
        from vlp.benchmarks import registry

        registry.load_all()
        return getattr(registry, name)
    if name in _FROM_BASE:
        from vlp.benchmarks import base

        return getattr(base, name)
    raise AttributeError(f"module 'vlp.benchmarks' has no attribute {name!r}")
