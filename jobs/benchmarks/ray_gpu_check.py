"""The GPU check's Ray paths (`make gpu-check-ray`): Ray Train and Ray Data on this machine's
GPU, through what `ray job submit` runs, on a one-node cluster started here; the parts and
their figures are in vlp/platform/gpu_check/ray_paths.py and docs/gpu-check.md.

Without a CUDA device, or without Ray, it says so in one line and exits 0. `--check` runs
anywhere: prints the plan and passes every command it would run through that command's own
`--check` (config, data and settings validated; nothing trained, no Ray started).

    python jobs/benchmarks/ray_gpu_check.py [--out ray_gpu_check.json] [--steps 40] [--check]
    python jobs/benchmarks/ray_gpu_check.py --device cpu --quick   # the same paths, tiny, on CPU

`--device cpu --quick` is a rehearsal: a one-node cluster without GPUs, uniter-tiny, the
grid-r50 extractor at 224/320; its figures say only that every part runs. It ends with
`ray stop`, which stops every Ray on the machine: not beside another Ray.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from vlp.platform.extract.model_rate import write_images
from vlp.platform.gpu_check.ray_paths import Plan, refusal, run_on_gpu, tracking, write_world


def check(plan: Plan) -> int:
    """The plan, each command through its own --check (`vlp`'s entry point, in this process):
    config, data and settings; nothing trained, no Ray started."""
    from vlp.cli import main as vlp_main

    write_world(plan)
    write_images(plan.work / "jpegs", 4)
    commands = [*plan.runs(), ("extract", plan.extract_argv(plan.work / "jpegs"))]
    for name, argv in commands:
        if vlp_main([*argv, "--check"]) != 0:
            print(f"ray-gpu-check: {name}: `vlp {' '.join(argv)} --check` failed")
            return 1
        print(f"check {name}: vlp {' '.join(argv)} --check: ok")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--images", type=int, default=1000, help="real-shape images to write")
    p.add_argument("--extract-images", type=int, default=256)
    p.add_argument("--out", help="JSON of the figures (default $OUT/ray_gpu_check.json)")
    p.add_argument("--check", action="store_true",
                   help="print the plan and pass each command through its --check; no GPU")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                   help="cpu: run the parts on this CPU (with --quick: a rehearsal)")
    p.add_argument("--quick", action="store_true",
                   help="uniter-tiny and a small extractor instead of uniter-base and BUTD's")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="ray-gpu-check-") as tmp:
        work = Path(tmp)
        sets, line = tracking(work)
        plan = Plan(work, args.steps, args.images if not args.check else 40,
                    args.extract_images, sets, gpu=args.device == "cuda", quick=args.quick)
        if args.check:
            print(line)
            return check(plan)
        why = refusal(plan.gpu)
        if why:
            print(why)
            return 0
        print(line)
        out = Path(args.out or Path(os.environ.get("OUT", ".")) / "ray_gpu_check.json")

        def report(figures: dict, new: dict) -> None:
            for key, value in new.items():
                print(f"{key} {value}")
            out.write_text(json.dumps(figures, indent=1))

        from vlp.commands.pretrain import start_ray   # Ray is here (refusal() said so)

        figures = run_on_gpu(plan, report, start_ray)
    for part, error in figures["errors"].items():
        print(f"ray-gpu-check: the {part} part failed: {error}")
    return 1 if figures["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
