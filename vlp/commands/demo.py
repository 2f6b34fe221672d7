"""`vlp demo`: the platform's main job on the embedded default (what `make demo` runs)."""

from __future__ import annotations

import argparse


def register(sub) -> None:
    p = sub.add_parser(
        "demo", help="run the main job on the embedded default (synthetic world, local Ray)",
        description="The demo on the embedded default: generate (or reuse) the synthetic "
                    "world at demo scale, audit it for leakage, then run the most complete "
                    "job the platform has on it, with progress shown throughout.")
    p.add_argument("--out", default="runs/demo", metavar="DIR",
                   help="run folder (default runs/demo): world/, MLflow store, checkpoints")
    p.add_argument("--scale", default="demo", choices=["tiny", "demo", "full"],
                   help="synthetic world scale (default demo)")
    p.add_argument("--seed", type=int, default=0, help="world and training seed (default 0)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import time
    from pathlib import Path

    from vlp.commands.data_audit import format_report
    from vlp.datasets.audit import audit_world
    from vlp.datasets.synth import generate_world
    from vlp.datasets.world import WorldError, load_manifest

    out = Path(args.out).resolve()
    world = out / "world"
    start = time.perf_counter()
    print(f"[demo 1/2] synthetic world ({args.scale}, seed {args.seed}) → {world}", flush=True)
    try:
        m = load_manifest(world)
        reuse = (m.scale, m.seed) == (args.scale, args.seed)
    except WorldError:
        reuse = False
    if reuse:
        print("  reusing the world already there (same scale and seed)")
    else:
        generate_world(world, scale=args.scale, seed=args.seed, overwrite=world.exists())
    print(f"[demo 2/2] leakage audit and statistics", flush=True)
    report = audit_world(world)
    print(format_report(report))
    print(f"\ndemo finished in {time.perf_counter() - start:.0f}s")
    return 0 if report.ok else 1
