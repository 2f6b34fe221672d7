"""The batcher against the step, for the GPU check: its rate alone and a timed function beside
it on a thread or in a builder process.

Every training run goes through the local runner (``run_local``: the loop, DeepSpeed's
engine, the prefetcher, the local batch stream, checkpoints to a folder), the path that a
Ray worker runs, without Ray. Each function returns a dict of figures.
"""

from __future__ import annotations

import time
from typing import Any, Callable


from vlp.platform.gpu_check.runs import sampler_and_source


def batcher_rate(cfg, batches: int, warm: int = 0) -> dict[str, float]:
    """The local batcher's rate (one thread: masking, negatives, collate) on ``cfg``'s
    batches, in input units per second: over ``batches`` batches after ``warm`` untimed
    ones (the first window's read, which a long run pays once)."""
    sampler, source = sampler_and_source(cfg)
    try:
        for _ in range(warm):
            source.next(sampler.next())
        t0 = time.perf_counter()
        units = sum(int(source.next(sampler.next())["input_units"]) for _ in range(batches))
        wall = time.perf_counter() - t0
    finally:
        source.close()
    return {"batches": batches, "warm_batches": warm, "batcher_input_units_per_s": units / wall,
            "batcher_batches_per_s": batches / wall}


def build_batches_until(cfg, stop, count) -> None:
    """Build ``cfg``'s batches until ``stop`` is set, counting them in ``count`` (a shared
    integer): the prefetch thread's work, without the loop (``beside_batcher``)."""
    sampler, source = sampler_and_source(cfg)
    try:
        while not stop.is_set():
            source.next(sampler.next())
            with count.get_lock():
                count.value += 1
    finally:
        source.close()


def beside_batcher(cfg, where: str, fn: Callable[[], Any], warm: int = 3
                   ) -> tuple[Any, float]:
    """``fn()`` run while ``cfg``'s batches are built beside it, on a thread of this process
    (``where="thread"``: as the prefetcher builds them, sharing the GIL) or in a separate
    process (``"process"``): fn's result and the batches built per second meanwhile."""
    import multiprocessing as mp
    import threading

    ctx = mp.get_context("spawn")
    stop = ctx.Event() if where == "process" else threading.Event()
    count = ctx.Value("l", 0)
    maker = ctx.Process if where == "process" else threading.Thread
    worker = maker(target=build_batches_until, args=(cfg, stop, count), daemon=True)
    worker.start()
    try:
        deadline = time.monotonic() + 300
        while count.value < warm:   # past the first window's read: building batches
            if not worker.is_alive():
                raise RuntimeError(f"the batcher {where} exited"
                                   + (f" ({worker.exitcode})" if where == "process" else ""))
            if time.monotonic() > deadline:
                raise RuntimeError(f"the batcher {where} built {count.value} of {warm} "
                                   f"batches in 300 s")
            time.sleep(0.05)
        n0, t0 = count.value, time.perf_counter()
        result = fn()
        rate = (count.value - n0) / (time.perf_counter() - t0)
    finally:
        stop.set()
        worker.join(timeout=60)
    return result, rate
