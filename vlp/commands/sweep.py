"""`vlp sweep`: search pretraining configs with Ray Tune + Optuna + ASHA, or replay a paper's
ablation grid (UNITER Table 3); ranks every trial by Meta-Sum."""

from __future__ import annotations

import argparse

EPILOG = """\
examples:
  vlp sweep --config jobs/configs/sweep-demo.yaml
  vlp sweep --config jobs/configs/sweep-demo.yaml --replay table3 --set model.family=uniter-minilm
  vlp sweep --config jobs/configs/sweep-tiny.yaml --samples 4 --set space.masking=[conditional]
  vlp sweep --config jobs/configs/sweep-demo.yaml --check        # validate only, run nothing

Each trial pretrains its point of the space (or not: "no pretraining" is a point), then
finetunes and evaluates each benchmark in turn, reporting the Meta-Sum parts so far after
every stage (ASHA's time is the stage). Interrupted? Run the same command again: finished
trials are kept, interrupted ones resume where they stopped.
"""


def register(sub) -> None:
    p = sub.add_parser("sweep", help="search task mixes (Optuna + ASHA) or replay Table 3",
                       description="Run a sweep over pretraining configurations described by "
                                   "a sweep config: an Optuna (TPE) search with ASHA over the "
                                   "config's search space, or a replay of a paper's grid "
                                   "(--replay table3). Prints the leaderboard at the end.",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    p.set_defaults(func=run)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="YAML", help="sweep config (jobs/configs/sweep-*.yaml)")
    p.add_argument("--replay", metavar="NAME", help="replay a named grid instead of searching "
                   "(table3: UNITER Table 3's 13 lines)")
    p.add_argument("--samples", type=int, metavar="N", help="search: number of trials")
    p.add_argument("--name", help="sweep name (folder and MLflow parent run)")
    p.add_argument("--output-dir", metavar="DIR", help="runs root (MLflow store beside the sweep)")
    p.add_argument("--world", metavar="DIR", help="world folder (manifest.json) or its "
                   "storage URI (s3://bucket/worlds/demo)")
    p.add_argument("--family", help="model family, e.g. uniter-tiny, uniter-minilm")
    p.add_argument("--tracking-uri", help="MLflow tracking URI (default sqlite under OUTPUT_DIR)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override any config key, e.g. pretrain.train.steps=300, "
                        "space.tasks=[mlm,itm,mrfr], finetune.overrides=[train.steps_scale=0.5]")
    p.add_argument("--check", action="store_true",
                   help="check the config, the space and the world; run nothing")
    p.add_argument("--list-replays", action="store_true", help="list the replays and their lines")
    p.add_argument("--verbose", action="store_true",
                   help="print Ray's own output (Train/Tune logs, every worker's prints) "
                        "here too; by default it goes to a log file in the run folder")


def overrides(args: argparse.Namespace) -> list[str]:
    pairs = [("sweep.replay", args.replay), ("sweep.num_samples", args.samples),
             ("sweep.name", args.name), ("sweep.output_dir", args.output_dir),
             ("world", args.world), ("model.family", args.family),
             ("mlflow.tracking_uri", args.tracking_uri)]
    return [f"{k}={v}" for k, v in pairs if v is not None] + list(args.set)


def list_replays() -> None:
    from vlp.platform.sweep.replays import REPLAYS, replay_lines

    for name in REPLAYS:
        print(f"{name}:")
        for line in replay_lines(name):
            print(f"  {line.name}  {line.point.describe():58s}  paper: {line.paper}")


def run(args: argparse.Namespace) -> int:
    if args.list_replays:
        list_replays()
        return 0
    from vlp.platform.cluster import console
    from vlp.platform.sweep import load_sweep_config, run_sweep

    console.configure(quiet=not args.verbose)
    cfg = load_sweep_config(args.config, overrides(args))
    if args.check:
        from vlp.platform.sweep.preflight import check_sweep

        plan = check_sweep(cfg.resolved())
        n = len(plan.lines) or cfg.sweep.num_samples
        print(f"sweep {cfg.sweep.name}: config, space and world are fine ({cfg.mode}, {n} trials)")
        return 0
    result = run_sweep(cfg)
    return report(result)


def report(result) -> int:
    """The leaderboard and where to look next; the exit status."""
    from vlp.commands.ui import ui_hint
    from vlp.platform.tracking.leaderboard import ranking_verdict

    board = result.leaderboard
    print(f"\nLeaderboard of {board.sweep} ({board.mode}); {result.trials} trials, "
          f"{result.errors} failed, {result.seconds:.0f} s:\n")
    from vlp.platform.tracking.leaderboard_protocols import protocol_header

    for line in protocol_header(board.rows):
        print(line)
    print(board.markdown())
    print(board.noise_note())
    for line in ranking_verdict(board):
        print(line)
    print(f"MLflow: parent run {result.parent_run_id} in {result.tracking_uri}")
    print(ui_hint(result.tracking_uri), flush=True)
    if result.interrupted:
        print("interrupted: run the same command again to resume (finished trials are kept)")
        return 130
    return 1 if result.trials and result.errors == result.trials else 0
