"""Downstream finetuning and evaluation through the platform's training loop, and Meta-Sum.

    from vlp.platform.finetune import finetune_and_evaluate
    report = finetune_and_evaluate(checkpoint, ["vqa", "retrieval", "nlvr2", "refcoco+"],
                                   world="runs/demo/world", family="uniter-tiny")

Benchmarks are registered by name in ``benchmarks/`` (one file each).
"""

from vlp.benchmarks import BENCHMARKS, get_benchmark
from vlp.platform.finetune.finetune_config import (META_SUM_BENCHMARKS, FinetuneConfig,
                                                   load_finetune_config)
from vlp.platform.finetune.run import (BenchmarkReport, DownstreamReport, finetune_and_evaluate,
                                       run_finetune)

__all__ = ["BENCHMARKS", "get_benchmark", "META_SUM_BENCHMARKS", "FinetuneConfig",
           "load_finetune_config", "BenchmarkReport", "DownstreamReport",
           "finetune_and_evaluate", "run_finetune"]
