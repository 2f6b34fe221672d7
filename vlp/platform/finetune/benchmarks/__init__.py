"""The benchmark registry; importing this package registers every benchmark (one file each)."""

from vlp.platform.finetune.benchmarks import nlvr2, refcoco, retrieval, vcr, ve, vqa  # noqa: F401
from vlp.platform.finetune.benchmarks.base import (BENCHMARKS, Benchmark, BenchmarkContext,
                                                   EvalResult, TrainDefaults, UnknownBenchmark,
                                                   get_benchmark, task_id)

__all__ = ["BENCHMARKS", "Benchmark", "BenchmarkContext", "EvalResult", "TrainDefaults",
           "UnknownBenchmark", "get_benchmark", "task_id"]
