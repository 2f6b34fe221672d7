"""What the vlp training loop costs over a bare loop: the same model, task mix and batches.

    python jobs/benchmarks/loop_overhead.py                                # uniter-tiny
    python jobs/benchmarks/loop_overhead.py --family uniter-base --steps 6 --warmup 2

(a) bare: batches built beforehand from the same pipeline (the stage's plan read locally —
the same data plan and masking, not Ray Data's block order — each masked for the task the
loop's seeded sampler draws) and kept in memory; the loop is forward, backward, torch AdamW
step (the implementation the engine runs), nothing else. (b) vlp: ``pretrain`` end to end on
one Ray Train worker — Ray Data, the batch source with its masking on the prefetch thread, the
DeepSpeed engine (the stage ``auto`` picks: no ZeRO on one worker), the per-step statistics
all-reduce, reports every step. Both run on ``--threads`` torch threads (the worker gets that
many CPUs). Step time of (b) is the loop's own ``step_time_s``, measured on the worker: the
time between consecutive steps' records, the reporting and bookkeeping between them included.
(Not the time between reports as the driver sees them: Ray's controller collects reports when
it polls the workers, every 2 s, which quantises that time.) The first ``--warmup`` steps of
each are not measured. The data-wait share is the loop's own: the time it waited for its next
batch over the step time.

Budget batching fills each micro-batch up to ``--batch-units`` input units, and the two
arms' batches differ (Ray Data's block order): besides the ratio of median step times,
``vlp_over_bare_per_unit`` compares seconds per input unit over the measured steps.
``vlp_over_bare_cpu_per_unit`` compares the process CPU time per input unit (the loop's
``process_cpu_s``: every thread of the worker, its prefetching and reports included): the
work the worker itself adds, apart from the time other processes (Ray's, Ray Data's read
tasks) take from the same cores, which a CPU-only machine shares with the step.

Batches: ``--batch-units`` input units per micro-batch (default 1792 = the standard 32 pairs
× (20 tokens + 36 regions)) of the tiny synthetic world, or ``--world``.

Prints a settings block, then one figure per line: ``bare/step_ms``, ``vlp/step_ms``,
``vlp_over_bare``, ``vlp_over_bare_per_unit``, ``vlp/data_wait_share``, ...
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from vlp.platform.pretrain.job import load_pretrain_config, pretrain
from vlp.platform.training.engine import zero_stage

TINY_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "pretrain-tiny.yaml"


def bare_loop(cfg, steps: int, warmup: int) -> dict[str, float]:
    """(a): the model of the run, the batches the run's first stage would draw, in memory."""
    from vlp.datasets.stream.local_stream import local_batches
    from vlp.datasets.batching.task_sampler import TaskSampler
    from vlp.platform.training import checkpointing
    from vlp.platform.training.engine import optimizer_params, param_groups
    from vlp.platform.pretrain.run import loop_config
    from vlp.platform.pretrain.components import PretrainComponents
    from vlp.platform.pretrain.data import prepare

    setup = prepare(cfg)
    stage = cfg.stage_plan()[0]
    sampler = TaskSampler(dict(stage.tasks), cfg.run.seed * 1009)   # the loop's seed
    source = local_batches(setup.stages[0].plan)
    batches = []
    for _ in range(steps + warmup):
        task = sampler.next()
        batches.append((task, source.next(task)))
    source.close()
    checkpointing.seed_everything(cfg.run.seed)
    model = PretrainComponents(setup).build_model(cfg, list(setup.tasks)).train()
    o = cfg.optimizer
    # the implementation the engine runs (torch's fused AdamW by default): the ratio measures
    # the loop, not a difference of optimizers
    fused = optimizer_params(loop_config(cfg)).get("fused", False)
    opt = torch.optim.AdamW(param_groups(model, o.weight_decay), lr=o.lr, betas=o.betas,
                            eps=o.eps, fused=fused)
    times, cpu = [], []
    for i, (task, batch) in enumerate(batches):
        t0, c0 = time.perf_counter(), time.process_time()
        loss = model(batch, task=task)["loss"]
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), o.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
    units = sum(int(b["input_units"]) for _, b in batches[warmup:]) / steps
    return {"step_ms": 1e3 * statistics.median(times),
            "mean_step_ms": 1e3 * statistics.mean(times),
            "mean_cpu_ms": 1e3 * statistics.mean(cpu), "input_units_per_step": units}


def vlp_loop(cfg, warmup: int) -> dict[str, float]:
    """(b): the platform's loop end to end; reports every step. The steps of the last
    attempt (a worker that Ray restarted starts the history again)."""
    result = pretrain(cfg, progress=False, say=lambda line: None)
    rows = result.history[warmup:]
    if not rows:
        raise RuntimeError(f"the run recorded {len(result.history)} steps, none after the "
                           f"{warmup} warm-up steps (did a worker restart?)")
    times = [r["step_time_s"] for r in rows]
    return {"step_ms": 1e3 * statistics.median(times),
            "mean_step_ms": 1e3 * statistics.mean(times),
            "mean_cpu_ms": 1e3 * statistics.mean(r["process_cpu_s"] for r in rows),
            "data_wait_share": sum(r["data_wait_s"] for r in rows) / sum(times),
            "measured_steps": len(rows),
            "input_units_per_step": statistics.mean(r["global_batch_input_units"]
                                                    for r in rows)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--family", default="uniter-tiny")
    p.add_argument("--world", help="synthetic world (default: a tiny one in a temp folder)")
    p.add_argument("--steps", type=int, default=20, help="measured steps of each loop")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--batch-units", type=int, default=1792)
    p.add_argument("--bare-once", action="store_true", help="run (a) only before (b), not "
                   "also after it (the default averages the two)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = p.parse_args(argv)

    out = Path(tempfile.mkdtemp(prefix="vlp-bench-loop-"))
    world = args.world
    if world is None:
        from vlp.datasets.synth import generate_world

        world = str(generate_world(out / "world", scale="tiny", seed=0))
    total = args.steps + args.warmup
    overrides = [f"run.output_dir={out / 'runs'}", "run.name=loop-overhead",
                 f"model.family={args.family}", f"train.steps={total}", "train.log_every=1",
                 "train.grad_accum=1", f"data.batch_input_units={args.batch_units}",
                 "mlflow.enabled=false", f"checkpoint.interval={total}",
                 "scaling.num_workers=1", f"scaling.cpus_per_worker={args.threads}",
                 f"optimizer.warmup_steps={max(1, total // 4)}"]
    overrides += [f"data.sources.{n}.path={Path(world) / 'images' / n}"
                  for n in ("coco", "vg", "cc", "sbu")]
    cfg = load_pretrain_config(str(TINY_CONFIG), overrides + list(args.set))
    torch.set_num_threads(args.threads)
    from vlp.commands.pretrain import start_ray

    start_ray(cfg)
    print(f"# loop_overhead: {cfg.model.family}, {cfg.data.batch_input_units} input units per "
          f"micro-batch, mix {cfg.tasks}, precision {cfg.train.precision}, "
          f"ZeRO-{zero_stage(cfg.train.zero_stage, 1)}, prefetch {cfg.train.prefetch_batches}; "
          f"{args.warmup} warm-up + {args.steps} measured steps; {args.threads} threads; "
          f"load average {os.getloadavg()[0]:.1f}")
    bare = bare_loop(cfg, args.steps, args.warmup)
    vlp = vlp_loop(cfg, args.warmup)
    if not args.bare_once:      # (a) again after (b): the machine's load drifts
        again = bare_loop(cfg, args.steps, args.warmup)
        print(f"bare/step_ms_before {bare['step_ms']:.1f}")
        print(f"bare/step_ms_after {again['step_ms']:.1f}")
        bare = {k: (bare[k] + again[k]) / 2 for k in bare}
    print(f"bare/step_ms {bare['step_ms']:.1f}")
    print(f"bare/mean_step_ms {bare['mean_step_ms']:.1f}")
    print(f"bare/input_units_per_step {bare['input_units_per_step']:.0f}")
    print(f"vlp/step_ms {vlp['step_ms']:.1f}")
    print(f"vlp/mean_step_ms {vlp['mean_step_ms']:.1f}")
    print(f"vlp/input_units_per_step {vlp['input_units_per_step']:.0f}")
    print(f"vlp/measured_steps {vlp['measured_steps']}")
    print(f"vlp/data_wait_share {vlp['data_wait_share']:.3f}")
    print(f"vlp_over_bare {vlp['step_ms'] / bare['step_ms']:.3f}")
    per_unit = ((vlp["mean_step_ms"] / vlp["input_units_per_step"])
                / (bare["mean_step_ms"] / bare["input_units_per_step"]))
    print(f"vlp_over_bare_per_unit {per_unit:.3f}")
    cpu = {k: d["mean_cpu_ms"] / d["input_units_per_step"] for k, d in (("bare", bare),
                                                                       ("vlp", vlp))}
    print(f"bare/cpu_us_per_unit {1e3 * cpu['bare']:.1f}")
    print(f"vlp/cpu_us_per_unit {1e3 * cpu['vlp']:.1f}")
    print(f"vlp_over_bare_cpu_per_unit {cpu['vlp'] / cpu['bare']:.3f}")
    print(f"# load average at the end {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
