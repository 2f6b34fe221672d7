"""The local batcher's rate on real-shaped data, one thread: ``PretrainBatches.next`` over
the first N batches of uniter-base's 10,240-unit config (the GPU check's, UNITER's task mix),
on the shards of ``bench_sources.py``.

    python jobs/benchmarks/batcher_rate.py [--world PATH] [--batches 150] [--profile]

Prints one figure per line (``name value``): input units/s over all batches; per task, its
batches' units over the seconds of their ``next`` calls less the time spent reading and
cutting windows (``window_s``: that work is done for whichever task's call needs the next
window, so it is counted once, apart); the CPU seconds of the batcher's thread (page faults
included, waits for the block reader not: a figure less moved by a shared machine's load than
the rate); the process's peak RSS. ``--profile`` adds cProfile's
top entries (cumulative and own time). ``--digest`` prints a SHA-256 over every batch served
(keys, dtypes, shapes, bytes, in order; hashing excluded from the timings): equal digests
across commits mean the batches did not change. ``--world`` reuses shards written before (they are
written to a temporary folder otherwise, ~1 GB).

``--processes 1 2 4`` measures builder processes instead (``train.batch_builders``: a
``BuilderPool`` of N, each building every N-th batch and reading 1/N of the files): input
units/s received per count, over ``--batches`` batches after ``4 × N`` warm-up ones (the
processes' start and first windows), with the loop's look-ahead (the prefetcher's target) and
the batches only looked at, not copied (the builders are timed, not the consumer), and the
ratio to N × the first count's rate (1.0: linear); and input units per CPU second of the
builders' processes (``/proc``) with its ratio to the first count's (``cpu_efficiency``: 1.0,
nothing done twice), a figure that does not need a core per builder to be read; and this
process's CPU seconds per million input units (the loop's process: taking the batches, and
with ``--stream-here`` reading the stream and sending it to the builders, as a worker does
with its Ray Data shard); and the cores the builders kept busy (``cores_busy``: their CPU
seconds per second; below the cores they had, they waited on each other's reads or on the
look-ahead).
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import io
import os
import pstats
import resource
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from bench_sources import write_bench_sources
from gpu_check import default_tokenizer

from vlp.platform.gpu_check.check import sizes
from vlp.platform.gpu_check.runs import experiment, sampler_and_source


def bench_config(world: Path, tmp: Path, tokenizer: str | None):
    """The GPU check's uniter-base batcher config on the shards in ``world``."""
    s = sizes(quick=False, gpu=True)
    return experiment(world, tmp / "runs", "batcher", family=s["family"], precision="bf16",
                      steps=s["steps"], units=s["units"], gpu=False, log_every=s["steps"],
                      tokenizer=tokenizer)


def build(world: Path, tmp: Path, tokenizer: str | None):
    """The GPU check's batcher: a (sampler, PretrainBatches) pair on its config."""
    return sampler_and_source(bench_config(world, tmp, tokenizer))


def batch_digest(digest, task: str, batch: dict) -> None:
    digest.update(task.encode())
    for k, v in batch.items():
        a = v.numpy()
        digest.update(f"{k} {a.dtype} {a.shape}".encode())
        digest.update(a.tobytes())


def measure(sampler, source, n: int, digest=None) -> dict[str, float]:
    window = [0.0]
    pull = source._pull

    def timed_pull(*a, **kw):   # reading blocks and cutting (collating) windows
        t0 = time.perf_counter()
        try:
            return pull(*a, **kw)
        finally:
            window[0] += time.perf_counter() - t0

    source._pull = timed_pull
    units, secs, count = defaultdict(int), defaultdict(float), defaultdict(int)
    t_all, cpu_all = time.perf_counter(), time.thread_time()
    for _ in range(n):
        task = sampler.next()
        before = window[0]
        t0 = time.perf_counter()
        batch = source.next(task)
        secs[task] += time.perf_counter() - t0 - (window[0] - before)
        units[task] += int(batch["input_units"])
        count[task] += 1
        if digest is not None:
            t0, c0 = time.perf_counter(), time.thread_time()
            batch_digest(digest, task, batch)
            t_all += time.perf_counter() - t0
            cpu_all += time.thread_time() - c0
    wall, cpu = time.perf_counter() - t_all, time.thread_time() - cpu_all
    out = {"batches": n, "input_units_per_s": sum(units.values()) / wall,
           "wall_s": wall, "batcher_thread_cpu_s": cpu, "window_s": window[0]}
    for task in sorted(units):
        out[f"{task}.batches"] = count[task]
        out[f"{task}.ms_per_batch_after_window"] = 1e3 * secs[task] / count[task]
        out[f"{task}.units_per_s_after_window"] = units[task] / secs[task]
    return out


def process_cpu_s(pids: list[int]) -> float:
    """CPU seconds (user + system) the processes ``pids`` have used so far."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])   # utime, stime
    return total / tick


class StreamHere:
    """The local reader as a stream that stays in this process, as a Ray Data shard stays in
    its worker: read here and sent to the builders."""

    def __init__(self, blocks):
        self.blocks = blocks

    def __call__(self, epoch: int):
        return self.blocks(epoch)


def pool_rate(world: Path, tmp: Path, tokenizer, count: int, batches: int,
              stream_here: bool = False) -> tuple[float, float, float, float]:
    """Input units/s a pool of ``count`` builder processes delivers, input units per CPU
    second of its processes (their own work, whatever the machine's cores), the CPU seconds
    per million input units this process spent (serving a ``stream_here``), and the cores
    the builders kept busy (their CPU seconds per second: below the cores they had, they
    waited)."""
    from vlp.platform.training.builder_pool import builder
    from vlp.platform.training.packed_batch import unpack

    sampler, source = build(world, tmp, tokenizer)
    if stream_here:
        source._blocks_fn = StreamHere(source._blocks_fn)
    pool = builder(sampler, source, count)   # one process, or a pool
    pool.start()
    warm = 4 * count
    members = getattr(pool, "members", [pool])
    ahead = max(2, count)   # as the loop's prefetcher: each active builder one batch ahead
    received = 0

    def take(n: int) -> int:
        nonlocal received
        units = 0
        for _ in range(n):
            pool.set_target(received + 1 + ahead)
            task, buffer, slot, layout, _ = pool.receive()
            units += int(unpack(buffer, layout)["input_units"])   # no copy: the builders timed
            pool.release(slot)
            received += 1
        return units

    try:
        take(warm)
        pids = [m._proc.pid for m in members]
        cpu0, here0 = process_cpu_s(pids), time.process_time()
        t0 = time.perf_counter()
        units = take(batches)
        wall = time.perf_counter() - t0
        cpu = process_cpu_s(pids) - cpu0
        return (units / wall, units / cpu, 1e6 * (time.process_time() - here0) / units,
                cpu / wall)
    finally:
        pool.close()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--world", help="a folder with images/coco and images/vg shards "
                   "(written there first if it has none)")
    p.add_argument("--batches", type=int, default=150)
    p.add_argument("--profile", action="store_true")
    p.add_argument("--top", type=int, default=30)
    p.add_argument("--digest", action="store_true")
    p.add_argument("--processes", type=int, nargs="+",
                   help="measure builder processes, at these counts")
    p.add_argument("--images", type=int, default=None, help="images of the written world")
    p.add_argument("--stream-here", action="store_true",
                   help="with --processes: read the stream in this process and send it to the "
                   "builders, as a Ray Data shard is (its CPU here is printed)")
    args = p.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="vlp-batcher-rate-"))
    world = Path(args.world) if args.world else tmp / "world"
    if not (world / "images" / "coco").is_dir():
        shape = dict(sizes(quick=False, gpu=True)["world"])
        if args.images:
            shape["images"] = args.images
        write_bench_sources(world, **shape)
    if args.processes:
        first = None
        for n in args.processes:
            rate, per_cpu, here, busy = pool_rate(world, tmp, default_tokenizer(), n, args.batches,
                                            args.stream_here)
            first = first or (rate, n, per_cpu)
            print(f"builders{n}_input_units_per_s {rate:.4g}")
            print(f"builders{n}_ratio_to_linear {rate / (first[0] * n / first[1]):.3f}")
            print(f"builders{n}_input_units_per_cpu_s {per_cpu:.4g}")
            print(f"builders{n}_cpu_efficiency {per_cpu / first[2]:.3f}")
            print(f"builders{n}_loop_process_cpu_s_per_million_units {here:.3f}")
            print(f"builders{n}_cores_busy {busy:.2f}")
        return 0
    sampler, source = build(world, tmp, default_tokenizer())
    prof = cProfile.Profile() if args.profile else None
    digest = hashlib.sha256() if args.digest else None
    try:
        if prof:
            prof.enable()
        out = measure(sampler, source, args.batches, digest)
        if prof:
            prof.disable()
    finally:
        source.close()
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if digest is not None:
        out["digest"] = digest.hexdigest()
    for k, v in out.items():
        print(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}")
    if prof:
        for key in ("cumulative", "tottime"):
            text = io.StringIO()
            pstats.Stats(prof, stream=text).sort_stats(key).print_stats(args.top)
            print(text.getvalue())
    return 0


if __name__ == "__main__":
    sys.exit(main())
