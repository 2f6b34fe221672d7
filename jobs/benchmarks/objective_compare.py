"""The pretraining objective by the finetuned Meta-Sum: sampled vs summed (issue 18, item 3),
or with ``--compare mrfr`` MRFR's loss on the papers' scale vs the reference code's (issue 39:
``model.mrfr_reduction`` sum-features vs mean-elements, the family's paper objective).

For each family (default imagebert-tiny and soho-tiny; vlbert-tiny on request), objective and
seed: pretrain on the
world's corpora through the platform's pretraining job with ``train.objective`` set (the same
steps and batch budget for both objectives, so both see the same number of example sets;
summed computes every task's loss on each set, sampled one task's), then finetune and evaluate
on the Meta-Sum benchmarks through the product path (``finetune_and_evaluate``). Prints one
figure per line: per run the examples seen and each part, then per arm Meta-Sum mean ± sample
std over seeds.

    python jobs/benchmarks/objective_compare.py --scale tiny --seeds 0 \\
        --pretrain-steps 60 --finetune-steps 60 --out runs/objective-compare
    python jobs/benchmarks/objective_compare.py --world runs/demo/world --seeds 0 1 2
                           # the issue's size: demo world, 3 seeds, the demo sweep's budget
    python jobs/benchmarks/objective_compare.py --compare mrfr --families imagebert-tiny \
        --scale tiny --seeds 0 1 2 --pretrain-steps 40 --finetune-steps 40 --pretrain-mode local

Mixes: each family's paper tasks at equal ratios (the papers' loss weight 1 each under
summed; equal draw shares under sampled). SOHO reads pixels and RefCOCO+ scores detected
regions, so soho-tiny's figure is the sum of the other four parts (``parts_sum``), not
Meta-Sum; the two families' figures do not compare with each other.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from vlp.testing.bench_worlds import ensure_world
from vlp.testing.calibration import pretrain

MIXES = {"imagebert-tiny": {"mlm": 1.0, "moc": 1.0, "mrfr": 1.0, "itm": 1.0},
         "soho-tiny": {"mlm": 1.0, "mvm": 1.0, "itm": 1.0},
         # VL-BERT's three tasks (§3.3); under summed one forward per example with words and
         # RoIs masked together (the family's forward group: "summed-joint")
         "vlbert-tiny": {"mlm": 1.0, "mrc-vlbert": 1.0, "sirp": 1.0}}
OBJECTIVES = ("sampled", "summed")
# --compare → the arms: (name, train.objective, model.mrfr_reduction); "" = the family's
ARMS = {"objective": [(o, o, "") for o in OBJECTIVES],
        "mrfr": [("mrfr-" + r, "", r) for r in ("sum-features", "mean-elements")]}


def figure(name: str, value: float, unit: str = "") -> None:
    print(f"{name} {value:.2f}{' ' + unit if unit else ''}", flush=True)


def examples_seen(checkpoint: str) -> float:
    """From a platform checkpoint's trainer state; NaN for a local run's state-dict file."""
    state = Path(checkpoint) / "vlp_trainer.json"
    return json.loads(state.read_text())["examples_seen"] if state.is_file() else float("nan")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="runs/objective-compare", help="runs folder")
    p.add_argument("--world", type=Path, help="world folder (default: a cached synthetic one)")
    p.add_argument("--scale", default="demo", help="the cached world's scale without --world")
    p.add_argument("--compare", choices=list(ARMS), default="objective",
                   help="objective: sampled vs summed; mrfr: MRFR's scale (families with mrfr)")
    p.add_argument("--families", nargs="+", default=["imagebert-tiny", "soho-tiny"],
                   choices=list(MIXES))
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--pretrain-steps", type=int, default=300)
    p.add_argument("--pretrain-units", type=int, default=2048, help="input units per batch")
    p.add_argument("--pretrain-lr", type=float, default=1e-3)
    p.add_argument("--finetune-steps", type=int, default=300, help="each benchmark's steps")
    p.add_argument("--finetune-lr", type=float, default=1e-3)
    p.add_argument("--pretrain-mode", choices=["platform", "local"], default="platform",
                   help="local: a single-process loop without Ray (vlp.testing.calibration)")
    p.add_argument("--workers", type=int, default=1, help="finetune workers")
    p.add_argument("--set", action="append", default=[], help="finetune config override")
    args = p.parse_args()

    from vlp.benchmarks.meta_sum import PART_NAMES, parts_of
    from vlp.models.families import get_family
    from vlp.platform.finetune import META_SUM_BENCHMARKS, finetune_and_evaluate

    world = ensure_world(args.world.resolve() if args.world else None, args.scale)
    out = Path(args.out).resolve()
    finetune = [f"settings.{b}.{k}={v}" for b in META_SUM_BENCHMARKS
                for k, v in (("steps", args.finetune_steps), ("lr", args.finetune_lr))]
    finetune += args.set
    print(f"# world {world}; {args.pretrain_steps} pretraining steps of "
          f"{args.pretrain_units} units; finetunes {args.finetune_steps} steps; seeds "
          f"{args.seeds}", flush=True)
    results: dict[str, list[float]] = {}
    for family in args.families:
        benchmarks = [b for b in META_SUM_BENCHMARKS   # region benchmarks need regions
                      if get_family(family).visual.input_kind == "regions"
                      or b != "refcoco+"]
        parts = [p.name for b in benchmarks for p in parts_of(b)]
        label = "meta_sum" if len(parts) == len(PART_NAMES) else "parts_sum"
        for arm_name, objective, reduction in ARMS[args.compare]:
            if reduction and "mrfr" not in MIXES[family]:
                print(f"# {family} has no mrfr task: skipped", flush=True)
                break
            arm = f"{family}.{arm_name}"
            for seed in args.seeds:
                t = time.perf_counter()
                budget = f"{args.pretrain_steps}x{args.pretrain_units}"
                ckpt = pretrain(str(world), str(out), f"pre-{arm}-{budget}-s{seed}",
                                family=family, tasks=MIXES[family], steps=args.pretrain_steps,
                                lr=args.pretrain_lr, batch_units=args.pretrain_units,
                                seed=seed, mode=args.pretrain_mode, objective=objective,
                                mrfr_reduction=reduction, say=lambda s: None)
                figure(f"{arm}.s{seed}.pretrain_s", time.perf_counter() - t, "s")
                figure(f"{arm}.s{seed}.examples_seen", examples_seen(ckpt))
                t = time.perf_counter()
                report = finetune_and_evaluate(
                    ckpt, benchmarks, world=str(world), family=family,
                    run_name=f"ft-{arm}-{budget}-s{seed}", output_dir=str(out), seed=seed,
                    num_workers=args.workers, overrides=finetune, mlflow=False)
                total = float(sum(report.scores[p] for p in parts))
                for k, v in {**report.scores, label: total}.items():
                    figure(f"{arm}.s{seed}.{k}", v)
                figure(f"{arm}.s{seed}.finetune_s", time.perf_counter() - t, "s")
                results.setdefault(f"{arm}.{label}", []).append(total)
                (out / "objective-compare.json").write_text(json.dumps(results, indent=1))
    for arm, scores in results.items():
        v = np.array(scores)
        std = v.std(ddof=1) if len(v) > 1 else float("nan")
        print(f"{arm}: {v.mean():.2f} ± {std:.2f} (n={len(v)}: "
              f"{', '.join(f'{s:.2f}' for s in v)})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
