"""The benchmark registry; importing this package registers every benchmark (one file each)."""

from vlp.benchmarks import nlvr2, refcoco_plus, retrieval, vcr, ve, vqa  # noqa: F401
from vlp.benchmarks.base import (BENCHMARKS, Benchmark, BenchmarkContext,
                                                   EvalResult, TrainDefaults, UnknownBenchmark,
                                                   get_benchmark, task_id)

__all__ = ["BENCHMARKS", "Benchmark", "BenchmarkContext", "EvalResult", "TrainDefaults",
           "UnknownBenchmark", "get_benchmark", "task_id"]
