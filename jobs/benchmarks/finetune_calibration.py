"""Calibration of the synthetic world: does pretraining matter downstream?

For each seed: pretrain a small model with MLM + ITM (or the ``--tasks`` mix) on the demo
world's corpora, then finetune and evaluate both it and a fresh initialisation ("no
pretraining", UNITER Table 3 line 1) on the Meta-Sum benchmarks through the product path
(``finetune_and_evaluate``: the Ray Train + DeepSpeed loop, sharded evaluation). Prints one
figure per line — per seed, then mean and standard deviation per benchmark and Meta-Sum for
both arms, the gap, and whether it clears the bar (≥ 10 Meta-Sum points and > 2σ, σ the
larger arm's standard deviation of Meta-Sum over seeds).

    python jobs/benchmarks/finetune_calibration.py --out runs/calibration --seeds 0 1 2
    python jobs/benchmarks/finetune_calibration.py --demo-budget ...   # the demo sweep's budget

The acceptance run (issue 6), 25-30 minutes per seed on two cores:

    python jobs/benchmarks/finetune_calibration.py --dropout 0 --pretrain-mode local \\
        --demo-finetunes --world W --out O

Why 10,000 pretraining steps of 4,096 units by default: MLM with BERT's random 15% masking
learns to read the image late. Along one MLM+ITM run (``grounding_curve.py``), the grounding
probe (masked class words of val captions with the caption's own image / another image,
chance 6.25) reads 14.8 / 14.8 at step 4,000 (text prior only), 17.1 / 11.5 at 7,000 and
23.9 / 9.9 at 10,000; ITM accuracy leaves 0.50 only after step 8,000. At 1,000 or 3,000
steps the pretrained model has nothing visual to bring to finetuning, and the calibration
fails. MLM-obj (``--tasks mlm-obj=1,itm=1``) grounds within 1,000 steps.

``--demo-budget``: the budget of ``jobs/configs/sweep-demo.yaml`` (300 pretraining steps of
2,048 units; 300-step finetunes at lr 1e-3) instead of the defaults (10,000 pretraining steps
of 4,096 units; each benchmark's own finetune defaults). ``--demo-finetunes``: only the
finetune half of it. Both keep VQA at 2e-4, the lr the recorded calibrations used (VQA's
default for -tiny is now 12x that, see ``vlp.platform.finetune.finetune_config.default_lr_scale``).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

from vlp.testing.calibration import pretrain

from vlp.benchmarks.meta_sum import PART_NAMES as PARTS  # noqa: E402
BAR_POINTS = 10.0
DEMO_FINETUNE = ["settings.refcoco+.steps=300", "settings.refcoco+.lr=1.0e-3",
                 "settings.nlvr2.steps=300", "settings.nlvr2.lr=1.0e-3",
                 "settings.vqa.steps=300", "settings.vqa.lr=2.0e-4",
                 "settings.retrieval.steps=300",
                 "settings.retrieval.lr=1.0e-3"]


def figure(name: str, value: float, unit: str = "") -> None:
    print(f"{name} {value:.2f}{' ' + unit if unit else ''}", flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="runs/calibration", help="runs folder")
    p.add_argument("--world", help="world folder (default: OUT/world, generated at demo scale)")
    p.add_argument("--scale", default="demo")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--family", default="uniter-tiny")
    p.add_argument("--pretrain-steps", type=int, default=10000)
    p.add_argument("--pretrain-lr", type=float, default=1e-3)
    p.add_argument("--pretrain-units", type=int, default=4096, help="input units per batch")
    p.add_argument("--pretrain-mode", choices=["auto", "platform", "local"], default="auto")
    p.add_argument("--steps-scale", type=float, default=1.0, help="× every finetune's steps")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--set", action="append", default=[], help="finetune config override")
    p.add_argument("--tasks", default="mlm=1,itm=1",
                   help="pretraining mix, task=ratio,... (e.g. mlm-obj=1,itm=1)")
    p.add_argument("--dropout", type=float, default=0.1,
                   help="hidden/attention dropout in pretraining and finetuning")
    p.add_argument("--none-from", metavar="JSON",
                   help="reuse the no-pretraining arm of an earlier run's "
                        "calibration-<mix>-d<dropout>.json (same seeds, world and finetune "
                        "settings) instead of finetuning it again")
    p.add_argument("--demo-budget", action="store_true",
                   help="the demo sweep's budget (see above); --set still applies after it")
    p.add_argument("--demo-finetunes", action="store_true",
                   help="the demo sweep's finetune settings with the default pretraining")
    args = p.parse_args()
    if args.demo_budget:
        args.pretrain_steps, args.pretrain_units = 300, 2048
    if args.demo_budget or args.demo_finetunes:
        args.set = [*DEMO_FINETUNE, *args.set]

    from vlp.datasets.synth import generate_world
    from vlp.datasets.storage.world import WorldError, load_manifest
    from vlp.platform.finetune import META_SUM_BENCHMARKS, finetune_and_evaluate

    out = Path(args.out).resolve()
    world = Path(args.world).resolve() if args.world else out / "world"
    try:
        load_manifest(world)
    except WorldError:
        t = time.perf_counter()
        generate_world(world, scale=args.scale, seed=0, overwrite=world.exists())
        figure("world_generation_s", time.perf_counter() - t, "s")
    results: dict[str, list[dict[str, float]]] = {"none": [], "pretrained": []}
    overrides = [f"train.steps_scale={args.steps_scale}", f"train.dropout={args.dropout}",
                 *args.set]
    try:
        tasks = {k: float(v) for k, v in (kv.split("=") for kv in args.tasks.split(","))}
    except ValueError:
        p.error(f"--tasks: expected task=ratio,..., got {args.tasks!r}")
    tag = f"{'-'.join(tasks)}-d{args.dropout:g}"   # names this mix's runs and results
    reused: dict[int, dict[str, float]] = {}
    if args.none_from:
        earlier = json.loads(Path(args.none_from).read_text())
        reused = dict(zip(earlier.get("seeds", []), earlier.get("none", [])))
        missing = [s for s in args.seeds if s not in reused]
        if missing:
            p.error(f"--none-from {args.none_from}: no no-pretraining scores for seed(s) {missing}")
    for seed in args.seeds:
        t = time.perf_counter()
        # the budget is in the name: an existing checkpoint is reused, never one of another budget
        budget = f"{args.pretrain_steps}x{args.pretrain_units}"
        ckpt = pretrain(str(world), str(out), f"pretrain-{tag}-{budget}-s{seed}",
                        family=args.family, tasks=tasks, steps=args.pretrain_steps,
                        lr=args.pretrain_lr, batch_units=args.pretrain_units, seed=seed,
                        mode=args.pretrain_mode, dropout=args.dropout,
                        say=lambda s: print(s, flush=True))
        figure(f"seed{seed}.pretrain_s", time.perf_counter() - t, "s")
        for arm, checkpoint in (("none", None), ("pretrained", ckpt)):
            if arm == "none" and seed in reused:
                results[arm].append(reused[seed])
                continue
            t = time.perf_counter()
            report = finetune_and_evaluate(
                checkpoint, META_SUM_BENCHMARKS, world=str(world), family=args.family,
                run_name=f"ft-{arm}-{tag}-s{seed}", output_dir=str(out), seed=seed,
                num_workers=args.workers, overrides=overrides, mlflow=False)
            scores = {**report.scores, "meta_sum": report.meta_sum}
            results[arm].append(scores)
            for k, v in scores.items():
                figure(f"seed{seed}.{arm}.{k}", v)
            figure(f"seed{seed}.{arm}.finetune_s", time.perf_counter() - t, "s")
        done = {"seeds": args.seeds[:len(results["pretrained"])], **results}
        (out / f"calibration-{tag}.json").write_text(json.dumps(done, indent=1))
    return summarise(results)


def summarise(results: dict[str, list[dict[str, float]]]) -> int:
    n = len(results["none"])
    for key in (*PARTS, "meta_sum"):
        stats = {}
        for arm in ("none", "pretrained"):
            v = np.array([r[key] for r in results[arm]])
            stats[arm] = (v.mean(), v.std(ddof=1) if n > 1 else 0.0)
            figure(f"{arm}.{key}.mean", stats[arm][0])
            figure(f"{arm}.{key}.std", stats[arm][1])
        figure(f"gap.{key}", stats["pretrained"][0] - stats["none"][0])
    gap = float(np.mean([r["meta_sum"] for r in results["pretrained"]])
                - np.mean([r["meta_sum"] for r in results["none"]]))
    sd = [float(np.std([r["meta_sum"] for r in results[a]], ddof=1)) if n > 1 else 0.0
          for a in ("none", "pretrained")]
    # seed noise: the larger of the two arms' standard deviations over seeds (stricter than
    # the standard error of the difference of the means, also printed)
    sigma = max(sd)
    figure("gap.meta_sum.sigma_seed", sigma)
    figure("gap.meta_sum.stderr_of_difference", math.sqrt((sd[0] ** 2 + sd[1] ** 2) / max(n, 1)))
    ok = gap >= BAR_POINTS and gap > 2 * sigma
    print(f"calibration {'PASS' if ok else 'FAIL'}: gap {gap:.2f} >= {BAR_POINTS:g} and "
          f"> 2 sigma = {2 * sigma:.2f}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
