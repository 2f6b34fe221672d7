"""What Ray Data's Parquet footer-actor pool costs a pretraining read: Ray's 32 actors against
the pool ``vlp.datasets.stream.footer_readers`` sizes to the files, alternated in one run.

    python jobs/benchmarks/footer_pool.py [--world DIR] [--scale tiny] [--rounds 3]

Each read is what a pretraining fit's driver does: ``build_dataset`` of the world's sources
(the schema sample and the read each list the files) and the whole stream consumed once, on
a local Ray of ``--num-cpus`` CPUs (as the tests' ``ray_local``). Per read: the wall seconds
and the CPU seconds of every process this run started (Ray's workers included; sampled every
0.2 s, so a process that lives less than that is undercounted in both arms alike). Prints
one figure a line (min over the rounds), the ratios last.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path

import psutil

from vlp.datasets.stream.data_config import DataConfig, world_sources
from vlp.datasets.stream.data_plan import plan_data
from vlp.datasets.stream.footer_readers import ENV, RAY_DEFAULT
from vlp.testing.bench_worlds import ensure_world

MIX = {"itm": 2, "mlm": 2, "mrfr": 1, "mrc-kl": 1}


class TreeCpu:
    """CPU seconds (user + system) of this process and all its descendants, the dead ones
    at their last sample."""

    def __init__(self, period_s: float = 0.2):
        self.me = psutil.Process()
        self.seen: dict[tuple[int, float], float] = {}
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.period_s = period_s
        self.sample()
        self.thread.start()

    def sample(self) -> None:
        for p in [self.me, *self.me.children(recursive=True)]:
            try:
                t = p.cpu_times()
                key = (p.pid, p.create_time())
            except psutil.Error:
                continue
            with self.lock:
                self.seen[key] = t.user + t.system

    def _run(self) -> None:
        while not self.stop.wait(self.period_s):
            self.sample()

    def total(self) -> float:
        self.sample()
        with self.lock:
            return sum(self.seen.values())

    def close(self) -> None:
        self.stop.set()
        self.thread.join()


def one_read(plan, actors: int | None, cpu: TreeCpu) -> tuple[float, float, int]:
    from vlp.datasets.stream.pipeline import build_dataset

    if actors is None:
        os.environ.pop(ENV, None)
    else:
        os.environ[ENV] = str(actors)
    c0, t0 = cpu.total(), time.perf_counter()
    ds = build_dataset(plan, reshuffle_files=False)
    rows = sum(b.num_rows for b in ds.iter_batches(batch_size=256, batch_format="pyarrow"))
    time.sleep(1.0)      # the pool's actors are killed after the listing: let them go
    return time.perf_counter() - t0 - 1.0, cpu.total() - c0, rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--world", type=Path, default=None)
    p.add_argument("--scale", default="tiny")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--num-cpus", type=int, default=4)
    args = p.parse_args(argv)

    import ray

    world = ensure_world(args.world, args.scale)
    plan = plan_data(DataConfig(sources=world_sources(str(world))), MIX)
    print(f"# world {world}: {len(plan.files)} shard files; load {os.getloadavg()[0]:.1f}")
    ray.init(address="local", num_cpus=args.num_cpus, include_dashboard=False,
             log_to_driver=False, configure_logging=False)
    cpu = TreeCpu()
    arms = {"ray_default": RAY_DEFAULT, "sized": None}
    got: dict[str, list[tuple[float, float]]] = {a: [] for a in arms}
    try:
        one_read(plan, None, cpu)          # warm: Ray Data's first start, imports
        for _ in range(args.rounds):
            for arm, actors in arms.items():
                wall, used, rows = one_read(plan, actors, cpu)
                got[arm].append((wall, used))
                print(f"# {arm}: {wall:.2f} s wall, {used:.2f} CPU s, {rows} rows",
                      flush=True)
    finally:
        cpu.close()
        ray.shutdown()
        os.environ.pop(ENV, None)
    best = {a: (min(w for w, _ in v), min(c for _, c in v)) for a, v in got.items()}
    for arm, (wall, used) in best.items():
        print(f"{arm}_read_wall_s {wall:.2f}")
        print(f"{arm}_read_cpu_s {used:.2f}")
    print(f"wall_ratio_default_over_sized {best['ray_default'][0] / best['sized'][0]:.2f}")
    print(f"cpu_ratio_default_over_sized {best['ray_default'][1] / best['sized'][1]:.2f}")
    print(f"load_after {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
