"""Throughput of the pretraining data pipeline against a raw pyarrow scan of the same shards.

    python jobs/benchmarks/pipeline_throughput.py [--world DIR] [--scale demo] [--epochs 3]
        [--feature-dim 2048] [--cache auto|always|never]

``--feature-dim`` rewrites the world's pretraining shards with random region features of that
width (BUTD's 2048: reading then costs what it costs on real data; cached next to the world).

Three measurements of the same shards in one run, each in examples ((image, caption) pairs)
per second:

- ``raw_scan``: pyarrow reads the columns the pipeline reads, file by file, and counts the
  pairs (no decoding, no tokenization): the floor of any reader.
- ``local``: the whole pipeline in this one process, without Ray (pyarrow → tokenize +
  region selection → window + bucketing → ITM / masking for the drawn task → tensors).
- ``batcher``: the worker side alone (window + bucketing + collate + ITM / masking →
  tensors) over rows already transformed and held in memory: what a Ray Train worker
  spends per pair, without Ray Data's delivery.
- ``ray``: the whole pipeline with Ray Data (read + map as Ray tasks) feeding the batcher in
  this process, as a Ray Train worker consumes it. Steady state per epoch = examples served /
  (last batch − first block of the epoch); Ray Data's start-up (to the first block) and the
  restart gap between epochs are reported apart.

The task of each batch is drawn from UNITER's in-domain mix (itm:mlm:mrfr:mrc-kl = 2:2:1:1).
Prints settings, then one figure per line (``name value unit``), the ratio last.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


import pyarrow.compute as pc
import pyarrow.parquet as pq

from vlp.contract import batch_spec as K
from vlp.datasets.stream.data_config import DataConfig, world_sources
from vlp.testing.bench_worlds import ensure_world, widen_world
from vlp.datasets.stream.data_plan import plan_data
from vlp.datasets.stream.local_stream import local_batches, local_blocks
from vlp.datasets.batching.pretrain_batches import PretrainBatches
from vlp.datasets.batching.task_sampler import TaskSampler

MIX = {"itm": 2, "mlm": 2, "mrfr": 1, "mrc-kl": 1}


def figure(name: str, value: float, unit: str = "") -> None:
    print(f"{name} {value:.4g} {unit}".rstrip(), flush=True)


def raw_scan(plan, repeats: int) -> float:
    best = 0.0
    for _ in range(repeats):
        t, pairs = time.perf_counter(), 0
        for f in plan.files:
            for rb in pq.ParquetFile(f).iter_batches(batch_size=1024,
                                                    columns=list(plan.read_columns)):
                pairs += pc.sum(pc.list_value_length(rb.column("captions"))).as_py() or 0
        best = max(best, pairs / (time.perf_counter() - t))
    return best


def batcher_rate(plan, epochs: int) -> tuple[float, float]:
    """(pairs/s, region-feature bytes the batches carry per feature byte of the rows)."""
    tables = list(local_blocks(plan)(0))
    src, sampler = PretrainBatches(plan, lambda epoch: iter(tables)), TaskSampler(MIX, seed=0)
    src.next(sampler.next())
    t, n, start_epoch, carried = time.perf_counter(), 0, src.epoch, 0
    while src.epoch < start_epoch + epochs:
        b = src.next(sampler.next())
        n += int(b[K.NUM_EXAMPLES])
        carried += b[K.REGION_FEATS].numel() * b[K.REGION_FEATS].element_size()
    rate = n / (time.perf_counter() - t)
    src.close()
    stored = sum(t.column("features").nbytes for t in tables) * epochs
    return rate, carried / stored


def local_rate(plan, epochs: int) -> float:
    src, sampler = local_batches(plan), TaskSampler(MIX, seed=0)
    src.next(sampler.next())   # warm-up: tokenizer load, first window
    t, n, start_epoch = time.perf_counter(), 0, src.epoch
    while src.epoch < start_epoch + epochs:
        n += int(src.next(sampler.next())[K.NUM_EXAMPLES])
    src.close()
    return n / (time.perf_counter() - t)


class TimedBlocks:
    """Wraps ``blocks(epoch)`` to record when each epoch's first and last block arrive."""

    def __init__(self, blocks):
        self.blocks, self.first, self.last = blocks, {}, {}

    def __call__(self, epoch):
        for table in self.blocks(epoch):
            now = time.perf_counter()
            self.first.setdefault(epoch, now)
            self.last[epoch] = now
            yield table


def ray_rates(plan, epochs: int, num_cpus: int) -> dict[str, float]:
    import ray

    from vlp.datasets.stream.pipeline import build_dataset, shard_blocks
    ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, log_to_driver=False,
             configure_logging=False)
    try:
        t0 = time.perf_counter()
        ds = build_dataset(plan)
        timed = TimedBlocks(shard_blocks(ds, plan))
        src, sampler = PretrainBatches(plan, timed), TaskSampler(MIX, seed=0)
        served: dict[int, int] = {}
        last_batch: dict[int, float] = {}
        while True:
            b = src.next(sampler.next())
            if src.epoch >= epochs:
                break
            served[src.epoch] = served.get(src.epoch, 0) + int(b[K.NUM_EXAMPLES])
            last_batch[src.epoch] = time.perf_counter()
        src.close()
    finally:
        ray.shutdown()
    steady = [served[e] / (last_batch[e] - timed.first[e]) for e in range(epochs)]
    out = {"startup_s": timed.first[0] - t0,
           "steady_first_epoch": steady[0],
           "steady_later_epochs": max(steady[1:]) if epochs > 1 else steady[0]}
    if epochs > 1:
        out["restart_gap_s"] = sum(timed.first[e + 1] - timed.last[e]
                                   for e in range(epochs - 1)) / (epochs - 1)
        total = sum(served.values()) / (last_batch[epochs - 1] - timed.first[0])
        out["all_epochs_with_restarts"] = total
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--world", type=Path, default=None, help="a vlp world (default: demo)")
    p.add_argument("--scale", default="demo", help="scale to generate when --world is not set")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-units", type=int, default=4096)
    p.add_argument("--num-cpus", type=int, default=2, help="Ray's logical CPUs")
    p.add_argument("--skip-local", action="store_true")
    p.add_argument("--feature-dim", type=int, default=0, help="rewrite features this wide")
    p.add_argument("--cache", default="auto", choices=["auto", "always", "never"])
    args = p.parse_args(argv)

    world = ensure_world(args.world, args.scale)
    if args.feature_dim:
        world = widen_world(world, args.feature_dim)
    cfg = DataConfig(sources=world_sources(str(world)), batch_units=args.batch_units,
                     cache=args.cache)
    plan = plan_data(cfg, MIX)
    print(f"# world {world}; {plan.summary()}")
    print(f"# D={plan.feature_dim} C={plan.num_classes} batch_units={cfg.batch_units} "
          f"bucket_window={cfg.bucket_window} cache={cfg.cache} mix={MIX}")
    raw = raw_scan(plan, repeats=10)   # best of 10: a demo-world scan takes ~30 ms
    figure("raw_scan_pairs_per_s", raw, "pairs/s")
    if not args.skip_local:
        figure("local_pipeline_pairs_per_s", local_rate(plan, args.epochs), "pairs/s")
        rate, expansion = batcher_rate(plan, max(args.epochs, 5))
        figure("batcher_pairs_per_s", rate, "pairs/s")
        # each pair carries its image's regions (COCO: ~5 captions), padded to the batch's
        # most regions: the bytes a batcher writes per byte a scan reads
        figure("batch_feature_bytes_per_row_byte", expansion)
    r = ray_rates(plan, args.epochs, args.num_cpus)
    figure("ray_data_startup_s", r["startup_s"], "s")
    if "restart_gap_s" in r:
        figure("ray_epoch_restart_gap_s", r["restart_gap_s"], "s")
        figure("ray_pipeline_pairs_per_s_incl_restarts", r["all_epochs_with_restarts"],
               "pairs/s")
    figure("ray_pipeline_pairs_per_s_first_epoch", r["steady_first_epoch"], "pairs/s")
    figure("ray_pipeline_pairs_per_s_steady", r["steady_later_epochs"], "pairs/s")
    figure("ratio_ray_pipeline_steady_to_raw_scan", r["steady_later_epochs"] / raw)
    return 0


if __name__ == "__main__":
    sys.exit(main())
