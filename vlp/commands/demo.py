"""`vlp demo`: the platform's main job on the embedded default (what `make demo` runs).

Synthetic world at demo scale → leakage audit → a small Optuna + ASHA sweep over task mixes
(jobs/configs/sweep-demo.yaml: no pretraining and the paper's best mix always among the
trials) on local Ray with a SQLite MLflow store in the run folder → the leaderboard and how
to open the MLflow UI.
"""

from __future__ import annotations

import argparse
from pathlib import Path

DEMO_SWEEP = Path(__file__).resolve().parents[2] / "jobs" / "configs" / "sweep-demo.yaml"


def register(sub) -> None:
    p = sub.add_parser(
        "demo", help="run the main job on the embedded default (synthetic world, local Ray)",
        description="The demo on the embedded default: generate (or reuse) the synthetic "
                    "world at demo scale, audit it for leakage, then run a small task-mix "
                    "sweep (Ray Tune + Optuna + ASHA; no pretraining and UNITER's best mix "
                    "among the trials) with progress shown throughout, and print the "
                    "leaderboard. Running it again resumes or reprints the sweep.")
    p.add_argument("--out", default="runs/demo", metavar="DIR",
                   help="run folder (default runs/demo): world/, MLflow store, sweep")
    p.add_argument("--scale", default="demo", choices=["tiny", "demo", "full"],
                   help="synthetic world scale (default demo)")
    p.add_argument("--seed", type=int, default=0, help="world and training seed (default 0)")
    p.add_argument("--trials", type=int, metavar="N", help="sweep trials (default: the "
                   "demo config's)")
    p.add_argument("--config", default=str(DEMO_SWEEP), metavar="YAML",
                   help="sweep config (default jobs/configs/sweep-demo.yaml)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a sweep config key (see `vlp sweep --help`)")
    p.add_argument("--fresh", action="store_true",
                   help="discard this folder's previous demo sweep and run a new one")
    p.add_argument("--no-sweep", action="store_true", help="world and audit only")
    p.add_argument("--verbose", action="store_true",
                   help="print Ray's own output (Train/Tune logs, every worker's prints) "
                        "here too; by default it goes to a log file in the run folder")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import time

    from vlp.commands.data.audit import format_report
    from vlp.datasets.audit.leakage import audit_world

    out = Path(args.out).resolve()
    world = out / "world"
    # the sweep's config (--set, --trials) is checked before the world is written: a bad
    # option leaves nothing behind
    cfg = None if args.no_sweep else sweep_config(args, out, world)
    start = time.perf_counter()
    steps = 2 if args.no_sweep else 3
    print(f"[demo 1/{steps}] synthetic world ({args.scale}, seed {args.seed}) → {world}",
          flush=True)
    make_world(world, args.scale, args.seed)
    t_world = time.perf_counter() - start
    print(f"[demo 2/{steps}] leakage audit and statistics", flush=True)
    report = audit_world(world)
    print(format_report(report), flush=True)
    if not report.ok:
        print("demo stopped: the world failed its leakage audit")
        return 1
    t_audit = time.perf_counter() - start - t_world
    if args.no_sweep:
        print(f"\ndemo finished in {time.perf_counter() - start:.0f}s")
        return 0
    print(f"[demo 3/3] task-mix sweep ({Path(args.config).name}) on local Ray; MLflow in {out}",
          flush=True)
    status = sweep(args, cfg)
    total = time.perf_counter() - start
    print(f"\ndemo finished in {total:.0f}s (world {t_world:.0f}s, audit {t_audit:.0f}s, sweep "
          f"{total - t_world - t_audit:.0f}s)")
    print(f"again: vlp leaderboard --run-dir {out}   |   vlp ui --run-dir {out}")
    return status


def make_world(world: Path, scale: str, seed: int) -> None:
    from vlp.datasets.synth import generate_world
    from vlp.datasets.storage.world import WorldError, load_manifest

    try:
        m = load_manifest(world)
        reuse = (m.scale, m.seed) == (scale, seed)
    except WorldError:
        reuse = False
    if reuse:
        print("  reusing the world already there (same scale and seed)")
    else:
        generate_world(world, scale=scale, seed=seed, overwrite=world.exists(), progress=True)


def sweep_config(args: argparse.Namespace, out: Path, world: Path):
    """The demo's sweep config, validated (the world it names need not exist yet)."""
    from vlp.platform.sweep import load_sweep_config

    overrides = [f"world={world}", f"sweep.output_dir={out}", f"sweep.seed={args.seed}"]
    if args.trials is not None:
        overrides.append(f"sweep.num_samples={args.trials}")
    return load_sweep_config(args.config, overrides + list(args.set))


def sweep(args: argparse.Namespace, cfg) -> int:
    from vlp.commands.sweep import report
    from vlp.platform.cluster import console
    from vlp.platform.sweep import run_sweep

    console.configure(quiet=not args.verbose)
    if args.fresh:
        from vlp.platform.cluster.run_storage import open_location

        resolved = cfg.resolved()           # its storage ($VLP_STORAGE) and its local folder
        for where in dict.fromkeys([resolved.sweep_uri, str(resolved.sweep_dir)]):
            folder = open_location(where)
            if folder.exists():
                print(f"  --fresh: removing the previous sweep {where}")
                folder.fs.delete_dir(folder.fs_root)
    result = run_sweep(cfg)
    status = report(result)
    print(pretraining_verdict(result.leaderboard), flush=True)
    return status


CALIBRATION = ("python jobs/benchmarks/finetune_calibration.py --dropout 0 --pretrain-mode "
               "local --demo-finetunes")


def pretraining_verdict(board) -> str:
    """Does the demo show pretraining beating no pretraining beyond seed noise? Said plainly,
    with the command that shows a real gap when it does not."""
    from vlp.platform.tracking.leaderboard_stats import indistinguishable

    none = next((r for r in board.rows if r.tasks == "None" and r.meta_sum is not None), None)
    pre = [r for r in board.rows if r.meta_sum is not None and _pretrained(r)]
    pointer = (f"a real gap needs more pretraining than the demo's budget: {CALIBRATION} "
               f"(~75 min on 2 cores; docs/benchmarks.md)")
    if none is not None and not pre:
        stopped = [r for r in board.rows if r.state == "stopped" and _pretrained(r)
                   and r.score is not None]
        if stopped:
            return stopped_verdict(none, max(stopped, key=lambda r: r.score), pointer)
    if none is None or not pre:
        return "demo: no finished pair of no pretraining and a pretrained mix to compare"
    best = max(pre, key=lambda r: r.meta_sum)
    same = indistinguishable(none.est["meta_sum"], best.est["meta_sum"])
    gap = best.meta_sum - none.meta_sum
    if same is None:
        return (f"demo: {best.tasks} − no pretraining = {gap:+.1f} Meta-Sum with one seed per "
                f"line and no noise estimate, so this ranking is not evidence; {pointer}")
    if same or gap <= 0:
        return (f"demo: {best.tasks} ({best.cell('meta_sum')}) and no pretraining "
                f"({none.cell('meta_sum')}) are within seed noise of each other at this "
                f"budget; {pointer}")
    return (f"demo: {best.tasks} ({best.cell('meta_sum')}) beats no pretraining "
            f"({none.cell('meta_sum')}) beyond seed noise (Welch's t-test, 5%)")


def _pretrained(row) -> bool:
    return row.tasks not in ("None", "", "MLM (text only)")


def stopped_verdict(none, best, pointer: str) -> str:
    """Every pretrained mix was stopped by ASHA before it had all of Meta-Sum's parts: compare
    the best of them with no pretraining on the parts it finished, each against no
    pretraining's own seed spread (pooled for the single-seed side)."""
    from vlp.platform.tracking.leaderboard import PARTS
    from vlp.platform.tracking.leaderboard_stats import estimate, indistinguishable, \
        pooled_variance

    said, beyond = [], []
    for key, label in PARTS:
        mine, ref = best.scores.get(key), none.seed_values.get(key) or []
        if mine is None or not ref:
            continue
        pooled = pooled_variance([ref])
        same = indistinguishable(estimate(best.seed_values.get(key) or [mine], pooled),
                                 estimate(ref, pooled))
        verdict = ("no noise estimate" if same is None else "within seed noise" if same
                   else "beyond seed noise" if mine > sum(ref) / len(ref)
                   else "below, beyond seed noise")
        beyond.append(verdict == "beyond seed noise")
        said.append(f"{label} {mine:.2f} vs {none.cell(key)} ({verdict})")
    where = f" after stage {best.stage}/{best.stages}" if best.stage is not None else ""
    head = (f"demo: ASHA stopped every pretrained mix before Meta-Sum was complete; the best, "
            f"{best.tasks}{where}, against no pretraining: {'; '.join(said) or 'no shared part'}")
    if said and all(beyond):
        return f"{head}. Its finished parts beat no pretraining beyond seed noise"
    return (f"{head}. At this budget the demo does not separate pretraining from none; "
            f"{pointer}")
