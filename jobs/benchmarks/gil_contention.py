"""What the prefetch thread's batch building costs a host-bound training loop through the GIL.

On a GPU the training step is host-bound: the main thread dispatches a couple of thousand
small operations per step, and each releases the GIL while it runs and takes it back after.
The prefetch thread builds the next batches (the real batcher: windows, masking, collate,
region gathers) in the same process. Whenever it holds the GIL when the main thread wants it
back, the main thread waits — up to the interpreter's switch interval (5 ms by default).

This measures that on a CPU: the main thread runs a dispatch loop of small torch operations
(a stand-in for a GPU step's launches, ``--ops`` per step), timed alone, then beside the real
batcher on real-shaped shards (``bench_sources.py``; uniter-base's 10,240-unit batches,
UNITER's mix) building without pause on a thread and in a separate process (no GIL shared:
what is left is the CPU the two share).

Then the loop as training runs it: a batch taken from the loop's own ``Prefetcher`` every
``--steps-per-batch`` steps, its batches built on a thread (``train.batch_builder: thread``)
and in the builder process (``process``), against the same loop taking batches built
before it started.

    python jobs/benchmarks/gil_contention.py [--world PATH] [--seconds 6]

Prints one figure per line: the dispatch loop's steps per second in each setting, its ratio
to the loop alone, the batcher's batches per second beside it, and the prefetcher loops'
data-wait shares.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

from batcher_rate import bench_config
from bench_sources import write_bench_sources
from gpu_check import default_tokenizer

from vlp.platform.gpu_check.check import sizes
from vlp.platform.gpu_check.batcher_load import beside_batcher
from vlp.platform.gpu_check.runs import sampler_and_source
from vlp.platform.training.prefetch import Prefetcher


def dispatch_steps(seconds: float, ops: int, before_step=None) -> float:
    """Steps per second of a loop of ``ops`` small operations per step (``before_step(i)``
    called before step i, if given)."""
    x = torch.ones(64)
    y = torch.ones(64)
    steps, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        if before_step is not None:
            before_step(steps)
        for _ in range(ops // 2):
            x.mul_(1.0)
            x.add_(y, alpha=0.0)
        steps += 1
    return steps / (time.perf_counter() - t0)


def fed_steps(cfg, builder: str | None, args) -> tuple[float, float]:
    """(steps/s, data-wait share) of the dispatch loop taking a batch from the loop's
    ``Prefetcher`` every ``--steps-per-batch`` steps; ``builder`` None: batches built before."""
    sampler, source = sampler_and_source(cfg)
    prefetch = Prefetcher(sampler, source, depth=2, device=torch.device("cpu"),
                          builder=builder or "thread")
    try:
        if builder is None:   # prebuilt: the same loop with nothing built beside it
            ready = [prefetch.next(10**6) for _ in range(8)]
            prefetch.close()
            take = (lambda i: ready[i % len(ready)])
        else:
            for _ in range(3):   # past the builder's start and the first window's read
                prefetch.next(10**6)
            take = (lambda i: prefetch.next(10**6))
        def feed(step: int) -> None:
            if step % args.steps_per_batch == 0:
                take(step // args.steps_per_batch)

        wait0, t0 = prefetch.wait_s, time.perf_counter()
        rate = dispatch_steps(args.seconds, args.ops, feed)
        wall = time.perf_counter() - t0
        wait = prefetch.wait_s - wait0 if builder is not None else 0.0
        return rate, wait / wall
    finally:
        prefetch.close()
        source.close()


def beside(where: str, cfg, args, interval: float | None) -> tuple[float, float]:
    """(dispatch steps/s, batches/s) with the batcher beside, in a thread or a process,
    under switch ``interval`` (None: the interpreter's)."""
    before = sys.getswitchinterval()

    def timed() -> float:
        if interval is not None:
            sys.setswitchinterval(interval)
        try:
            return dispatch_steps(args.seconds, args.ops)
        finally:
            sys.setswitchinterval(before)

    return beside_batcher(cfg, where, timed, warm=5)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--world", help="shards written before by bench_sources.py (default: "
                   "written to a temporary folder, ~1 GB)")
    p.add_argument("--seconds", type=float, default=6.0, help="each setting's timing")
    p.add_argument("--ops", type=int, default=2000, help="small operations per step")
    p.add_argument("--steps-per-batch", type=int, default=10,
                   help="steps per batch taken from the prefetcher (the loop must not wait "
                   "for data to show the GIL's cost)")
    p.add_argument("--tokenizer", default=default_tokenizer())
    args = p.parse_args(argv)
    tmp = None
    if args.world is None:
        tmp = tempfile.TemporaryDirectory()
        args.world = str(Path(tmp.name) / "world")
        write_bench_sources(Path(args.world), **sizes(quick=False, gpu=True)["world"])
    torch.set_num_threads(1)   # one core for the loop, as a host thread dispatching to a GPU
    runs = tempfile.TemporaryDirectory()
    cfg = bench_config(Path(args.world), Path(runs.name), args.tokenizer)
    alone = dispatch_steps(args.seconds, args.ops)
    print(f"switch_interval_default_s {sys.getswitchinterval():g}")
    print(f"alone.steps_per_s {alone:.4g}")
    for label, kind, interval in (("thread", "thread", None),
                                  ("thread_interval_0.1ms", "thread", 1e-4),
                                  ("process", "process", None)):
        rate, batches = beside(kind, cfg, args, interval)
        print(f"{label}.steps_per_s {rate:.4g}")
        print(f"{label}.over_alone {rate / alone:.3f}")
        print(f"{label}.batcher_batches_per_s {batches:.3g}")
    fed = {b: fed_steps(cfg, b, args) for b in (None, "thread", "process")}
    base = fed[None][0]
    print(f"prefetched_before.steps_per_s {base:.4g}")
    for b in ("thread", "process"):
        rate, wait = fed[b]
        print(f"prefetcher_{b}.steps_per_s {rate:.4g}")
        print(f"prefetcher_{b}.over_prefetched_before {rate / base:.3f}")
        print(f"prefetcher_{b}.data_wait_share {wait:.3f}")
    print(f"prefetcher_process_over_thread {fed['process'][0] / fed['thread'][0]:.3f}")
    runs.cleanup()
    if tmp is not None:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
