"""Compute a search spends to reach a grid's best Meta-Sum (Optuna + ASHA vs the Table 3 grid).

    python jobs/benchmarks/sweep_compute.py --tracking-uri sqlite:////abs/runs/demo/mlflow.db \
        --grid table3-demo --search search-demo [--tolerance 2.0]

Reads both sweeps' trial runs from MLflow. Compute is counted in optimizer steps (pretraining
+ finetuning, what each trial reports as ``trial_steps``; trials ASHA stopped count the steps
they ran; a re-proposed point whose results were reused counts 0) and in trial wall seconds
(on a shared CPU machine wall time includes waiting for cores: compare steps first). The
search "reaches" the grid when a trial finishes with Meta-Sum ≥ the grid's best − tolerance;
its cost is everything spent by the trials that had ended by then (end-time order).

Prints one figure per line: ``<name> <value>``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout

from vlp.platform.leaderboard import find_sweep_run  # noqa: E402


def trials(uri: str, sweep: str, experiment: str | None) -> list[dict]:
    """The sweep's trial runs in the order they ended."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    parent = find_sweep_run(uri, experiment, sweep=sweep)
    runs = client.search_runs([parent.info.experiment_id], max_results=10_000,
                              filter_string=f"tags.`mlflow.parentRunId` = "
                                            f"'{parent.info.run_id}' and tags.`vlp.job` = "
                                            f"'sweep-trial'")
    out = [{"trial": r.data.tags.get("vlp.sweep.trial", r.info.run_name),
            "mix": r.data.tags.get("mix", ""), "data": r.data.tags.get("pretraining_data", ""),
            "meta_sum": r.data.metrics.get("meta_sum"),
            "steps": int(r.data.metrics.get("trial_steps", 0)),
            "seconds": float(r.data.metrics.get("trial_seconds", 0.0)),
            "end": r.info.end_time or 0} for r in runs]
    return sorted(out, key=lambda t: t["end"])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tracking-uri", required=True)
    p.add_argument("--experiment", default=None)
    p.add_argument("--grid", required=True, help="the replay sweep's name")
    p.add_argument("--search", required=True, help="the Optuna search sweep's name")
    p.add_argument("--tolerance", type=float, default=0.0,
                   help="Meta-Sum points below the grid's best that count as reaching it")
    args = p.parse_args(argv)

    grid = trials(args.tracking_uri, args.grid, args.experiment)
    search = trials(args.tracking_uri, args.search, args.experiment)
    done = [t for t in grid if t["meta_sum"] is not None]
    if not done:
        print("grid has no finished trial", file=sys.stderr)
        return 1
    best = max(done, key=lambda t: t["meta_sum"])
    grid_steps = sum(t["steps"] for t in grid)
    grid_seconds = sum(t["seconds"] for t in grid)
    target = best["meta_sum"] - args.tolerance
    print(f"grid.trials {len(grid)}")
    print(f"grid.best_meta_sum {best['meta_sum']:.2f}")
    print(f"grid.best_trial {best['trial']} {best['mix'].replace(' ', '_')}")
    print(f"grid.steps_total {grid_steps}")
    print(f"grid.seconds_total {grid_seconds:.0f}")
    print(f"target_meta_sum {target:.2f}")
    steps = seconds = 0
    reached = None
    for i, t in enumerate(search, 1):
        steps += t["steps"]
        seconds += t["seconds"]
        if reached is None and t["meta_sum"] is not None and t["meta_sum"] >= target:
            reached = (i, t, steps, seconds)
    print(f"search.trials {len(search)}")
    best_search = max((t for t in search if t["meta_sum"] is not None),
                      key=lambda t: t["meta_sum"], default=None)
    if best_search is not None:
        print(f"search.best_meta_sum {best_search['meta_sum']:.2f}")
        print(f"search.best_trial {best_search['trial']} {best_search['mix'].replace(' ', '_')}")
    print(f"search.steps_total {steps}")
    print(f"search.seconds_total {seconds:.0f}")
    if reached is None:
        print("search.reached_grid_best no")
        return 0
    i, t, s_steps, s_seconds = reached
    print("search.reached_grid_best yes")
    print(f"search.reached_at_trial {i} ({t['trial']} {t['mix'].replace(' ', '_')} "
          f"{t['meta_sum']:.2f})")
    print(f"search.steps_to_reach {s_steps}")
    print(f"search.seconds_to_reach {s_seconds:.0f}")
    print(f"ratio.steps_to_reach_vs_grid {s_steps / max(grid_steps, 1):.3f}")
    print(f"ratio.seconds_to_reach_vs_grid {s_seconds / max(grid_seconds, 1e-9):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
