"""`vlp leaderboard`: print a sweep's leaderboard (Table 3's columns, each line's mean ± 95%
interval over its seeds, and which lines are not distinguishable from the best) from MLflow;
``--csv`` / ``--json`` print it as data."""

from __future__ import annotations

import argparse


def register(sub) -> None:
    p = sub.add_parser("leaderboard", help="print a sweep's leaderboard from MLflow",
                       description="Print the leaderboard of the latest sweep (or the one "
                                   "named) from its MLflow runs: pre-training data, task mix, "
                                   "Meta-Sum, VQA, IR, TR, NLVR2, RefCOCO+ per line: the mean "
                                   "over its seeds ± the 95%% t-interval, and whether it is "
                                   "distinguishable from the best line (Welch's t-test, 5%%).")
    add_store_arguments(p)
    p.add_argument("--experiment", metavar="NAME",
                   help="MLflow experiment (default: any experiment holding sweeps)")
    p.add_argument("--sweep", metavar="NAME", help="the sweep's name (default: the latest)")
    p.add_argument("--run-id", help="the sweep's parent run id")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--csv", action="store_true", help="print the lines as CSV")
    fmt.add_argument("--json", action="store_true", help="print the lines as JSON")
    p.set_defaults(func=run)


def add_store_arguments(p: argparse.ArgumentParser) -> None:
    """--tracking-uri or --run-dir (shared with `vlp ui`)."""
    g = p.add_mutually_exclusive_group()
    g.add_argument("--tracking-uri", metavar="URI",
                   help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else the "
                        "SQLite store of --run-dir)")
    g.add_argument("--run-dir", metavar="DIR",
                   help="a runs folder holding mlflow.db (default runs/demo, what `vlp demo` "
                        "writes)")


def tracking_uri(args: argparse.Namespace) -> str:
    import os
    from pathlib import Path

    from vlp.platform.tracking.mlflow_run import embedded_tracking_uri

    if args.tracking_uri:
        return args.tracking_uri
    if args.run_dir is None and os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"]
    folder = Path(args.run_dir or "runs/demo").expanduser().resolve()
    if not (folder / "mlflow.db").is_file():
        raise FileNotFoundError(f"{folder}/mlflow.db: no MLflow store there (run `vlp demo` or "
                                f"`vlp sweep` first, or pass --tracking-uri / --run-dir)")
    return embedded_tracking_uri(folder)


def run(args: argparse.Namespace) -> int:
    from vlp.platform.tracking.leaderboard import find_sweep_run, load_leaderboard

    uri = tracking_uri(args)
    run_id = args.run_id or find_sweep_run(uri, args.experiment, sweep=args.sweep).info.run_id
    board = load_leaderboard(uri, run_id)
    if args.csv or args.json:
        from vlp.platform.tracking.leaderboard_export import csv_text, json_text

        print((csv_text if args.csv else json_text)(board), end="")
        return 0
    from vlp.platform.tracking.leaderboard_protocols import protocol_header

    print(f"# {board.sweep} ({board.mode}), parent run {run_id}\n")
    for line in protocol_header(board.rows):
        print(line)
    print(board.markdown())
    print(board.noise_note())
    from vlp.platform.tracking.leaderboard import ranking_verdict

    for line in ranking_verdict(board):
        print(line)
    return 0
