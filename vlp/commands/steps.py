"""`vlp steps`: a run's every-step records (the Parquet step log in its storage): a summary,
CSV, or a plot of its losses."""

from __future__ import annotations

import argparse
import sys


def register(sub) -> None:
    p = sub.add_parser("steps", help="a run's per-step records: summary, CSV or loss plot",
                       description="Read the step log a training run keeps in its storage "
                                   "(RUN/steps/*.parquet: one row per optimizer step; MLflow "
                                   "holds window means) and print its size and last values, "
                                   "print it as CSV, or plot its losses.",
                       epilog="examples:\n  vlp steps runs/pretrain-tiny\n"
                              "  vlp steps runs/pretrain-tiny --plot loss.png\n"
                              "  vlp steps s3://bucket/runs/uniter-base-indomain --csv > s.csv"
                              "\n\nIn Python: pandas.read_parquet('runs/pretrain-tiny/steps')",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", metavar="RUN", help="the run's folder or URI (storage/NAME)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--plot", metavar="PNG", help="write the loss curves (total and per task)")
    g.add_argument("--csv", action="store_true", help="print every row as CSV")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import posixpath

    from vlp.platform.cluster.run_storage import StorageError, open_location
    from vlp.platform.tracking.step_log import STEPS_FOLDER, read_steps

    where = args.run.rstrip("/")
    try:
        frame = read_steps(open_location(posixpath.dirname(where) or "."),
                           posixpath.basename(where))
    except (OSError, StorageError) as e:
        print(f"vlp steps: {where}: {e}", file=sys.stderr)
        return 1
    if frame.empty:
        print(f"vlp steps: {where}/{STEPS_FOLDER}: no step records (not a training run's "
              f"folder, or a run from before step logs)", file=sys.stderr)
        return 1
    if args.csv:
        frame.to_csv(sys.stdout, index=False)
        return 0
    losses = [c for c in frame.columns if c == "loss" or c.endswith("_loss")]
    if args.plot:
        from vlp.platform.tracking.mlflow_run import loss_curve_figure

        curves = {k: [(int(s), float(v)) for s, v in zip(frame["step"], frame[k]) if v == v]
                  for k in losses}
        loss_curve_figure(curves, title=posixpath.basename(where)).savefig(args.plot)
        print(f"wrote {args.plot} ({len(frame)} steps, {', '.join(losses)})")
        return 0
    print(f"{len(frame)} steps ({int(frame['step'].min())}..{int(frame['step'].max())}), "
          f"{len(frame.columns)} columns: {', '.join(frame.columns)}")
    tail = frame.tail(min(len(frame), 10))
    for k in losses + [c for c in ("lr", "step_time_s") if c in frame.columns]:
        print(f"{k} (mean of the last {len(tail)} steps) {tail[k].mean():.4f}")
    return 0
