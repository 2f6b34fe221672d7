"""Pretraining throughput through the whole platform (Ray Data → Ray Train workers →
DeepSpeed ZeRO-2 → MLflow) with 1 and 2 workers (or ``--workers``), steady state and start-up
apart.

    python jobs/benchmarks/pretrain_throughput.py                         # tiny world, CPU
    python jobs/benchmarks/pretrain_throughput.py --world runs/demo/world --steps 120
    ray job submit ... -- python jobs/benchmarks/pretrain_throughput.py \\
        --config jobs/configs/uniter-base-indomain.yaml --workers 4,8 --steps 300

Start-up = from ``fit()`` to the first report (Ray Train workers, DeepSpeed engine, dataset
execution, MLflow run); steady state = examples and input units between the first and the
last report over the time between them. Prints a settings block, then one figure per line:
``workers_<n>/<metric> <value>``, the scaling ratio last.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import ray.train

from vlp.platform.pretrain.job import load_pretrain_config, pretrain

TINY_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "pretrain-tiny.yaml"


class ReportTimes(ray.train.UserCallback):
    """Appends (time, step, examples seen, input units seen) of every report to a file: the
    callback runs in Ray Train's controller, not in this process."""

    def __init__(self, path: str):
        self.path = path

    def after_report(self, run_context, metrics, checkpoint) -> None:
        m = metrics[0]
        with open(self.path, "a") as f:
            f.write(json.dumps([time.time(), m["step"], m["examples_seen"],
                                m["input_units_seen"]]) + "\n")


def measure(cfg, out: Path) -> dict[str, float]:
    times = out / f"reports-{cfg.scaling.num_workers}.jsonl"
    start = time.time()
    result = pretrain(cfg, callbacks=[ReportTimes(str(times))], progress=False,
                      say=lambda line: None)
    total = time.time() - start
    rows = [json.loads(line) for line in times.read_text().splitlines()]
    (t0, s0, e0, u0), (t1, s1, e1, u1) = rows[0], rows[-1]
    return {"startup_s": t0 - start, "total_s": total, "steps": result.final_step,
            "steady_steps": s1 - s0, "examples_per_s": (e1 - e0) / (t1 - t0),
            "input_units_per_s": (u1 - u0) / (t1 - t0),
            "examples_per_step": (e1 - e0) / max(1, s1 - s0)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default=str(TINY_CONFIG), help="experiment config (default: "
                   "pretrain-tiny.yaml on --world)")
    p.add_argument("--world", help="synthetic world whose coco/vg/cc/sbu sources replace the "
                   "config's (default with pretrain-tiny: a tiny world generated in a temp folder)")
    p.add_argument("--workers", default="1,2", help="worker counts to compare (default 1,2)")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--log-every", type=int, default=5, help="steps per report (window)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = p.parse_args(argv)

    out = Path(tempfile.mkdtemp(prefix="vlp-bench-pretrain-"))
    overrides = [f"run.output_dir={out / 'runs'}", f"train.steps={args.steps}",
                 f"train.log_every={args.log_every}", "mlflow.enabled=true",
                 f"checkpoint.interval={args.steps}"]
    world = args.world
    if world is None and Path(args.config) == TINY_CONFIG:
        from vlp.datasets.synth import generate_world

        world = str(generate_world(out / "world", scale="tiny", seed=0))
    if world:
        overrides += [f"data.sources.{n}.path={Path(world) / 'images' / n}"
                      for n in ("coco", "vg", "cc", "sbu")]
    counts = [int(n) for n in args.workers.split(",")]
    cfgs = {n: load_pretrain_config(args.config, overrides + list(args.set) + [
        f"scaling.num_workers={n}", f"run.name=bench-w{n}"]) for n in counts}
    from vlp.commands.pretrain import start_ray

    start_ray(cfgs[max(counts)])
    c = cfgs[counts[0]]
    print(f"# {c.model.family}, {args.steps} steps, {c.data.batch_input_units} input units per "
          f"worker per micro-batch, {c.train.precision}, ZeRO-{c.train.zero_stage}, "
          f"sources {', '.join(c.data.sources)}; cluster CPUs "
          f"{ray.cluster_resources().get('CPU', 0):g}, "
          f"GPUs {ray.cluster_resources().get('GPU', 0):g}")
    figures = {n: measure(cfgs[n], out) for n in counts}
    for n, f in figures.items():
        for k in ("startup_s", "total_s", "steady_steps", "examples_per_step", "examples_per_s",
                  "input_units_per_s"):
            print(f"workers_{n}/{k} {f[k]:.2f}")
    if len(counts) > 1:
        a, b = counts[0], counts[-1]
        print(f"examples_per_s_ratio_{b}_vs_{a} "
              f"{figures[b]['examples_per_s'] / figures[a]['examples_per_s']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
