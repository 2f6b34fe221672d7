"""Compute a search spends to reach a grid's best mean Meta-Sum within its noise (Optuna +
ASHA vs the Table 3 grid), over one or several searches (different ``sweep.seed``).

    python jobs/benchmarks/sweep_compute.py --tracking-uri sqlite:////abs/runs/demo/mlflow.db \
        --grid table3-demo --search search-s0 --search search-s1 --search search-s2

With replicates in the grid (``sweep.seeds``) the target is the best line's mean minus its
95% interval half-width, and the lines not distinguishable from the best are listed: reaching
"the grid's best" then means reaching what the grid can tell apart from it. With one seed per
line the target is the best single run (``--tolerance`` to widen it), which a search can beat
by luck.

Reads both sweeps' trial runs from MLflow. Compute is counted in optimizer steps (pretraining
+ finetuning, what each trial reports as ``trial_steps``; trials ASHA stopped count the steps
they ran; a re-proposed point whose results were reused counts 0) and in trial wall seconds
(on a shared CPU machine wall time includes waiting for cores: compare steps first). The
search "reaches" the grid when a trial finishes with (mean) Meta-Sum ≥ the target; its cost is
everything spent by the trials that had ended by then (end-time order).

Prints one figure per line: ``<name> <value>``.
"""

from __future__ import annotations

import argparse
import sys

from vlp.platform.tracking.leaderboard import find_sweep_run


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
    p.add_argument("--search", required=True, action="append",
                   help="an Optuna search sweep's name; repeat it for searches run with "
                        "different sweep.seed (the figure is then per search and their median)")
    p.add_argument("--tolerance", type=float, default=None,
                   help="Meta-Sum points below the grid's best mean that count as reaching "
                        "it (default: the best line's 95%% interval half-width when the grid "
                        "has replicates, else 0)")
    args = p.parse_args(argv)

    from vlp.platform.tracking.leaderboard import load_leaderboard

    parent = find_sweep_run(args.tracking_uri, args.experiment, sweep=args.grid)
    board = load_leaderboard(args.tracking_uri, parent.info.run_id)
    grid = trials(args.tracking_uri, args.grid, args.experiment)
    best = board.best()
    if best is None:
        print("grid has no finished trial", file=sys.stderr)
        return 1
    ci = best.est["meta_sum"].ci95() if "meta_sum" in best.est else None
    tolerance = args.tolerance if args.tolerance is not None else (ci or 0.0)
    grid_steps = sum(t["steps"] for t in grid)
    grid_seconds = sum(t["seconds"] for t in grid)
    target = best.meta_sum - tolerance
    print(f"grid.trials {len(grid)}")
    print(f"grid.seeds_per_line {'/'.join(str(n) for n in sorted({r.seeds for r in board.rows}))}")
    print(f"grid.best_meta_sum {best.meta_sum:.2f}")
    print(f"grid.best_ci95 {'none' if ci is None else f'{ci:.2f}'}")
    print(f"grid.best_trial {best.trial} {best.tasks.replace(' ', '_')}")
    tied = [r.trial for r in board.rows if r.verdict == "≈best"]
    print(f"grid.lines_within_noise_of_best {len(tied)} {' '.join(tied)}".rstrip())
    print(f"grid.steps_total {grid_steps}")
    print(f"grid.seconds_total {grid_seconds:.0f}")
    print(f"target_meta_sum {target:.2f} (best mean − {tolerance:.2f})")
    ratios = []
    for name in args.search:
        ratio = report_search(name, trials(args.tracking_uri, name, args.experiment), target,
                              grid_steps, grid_seconds)
        if ratio is not None:
            ratios.append(ratio)
    if len(args.search) > 1:
        print(f"searches.reached {len(ratios)} of {len(args.search)}")
        if ratios:
            ratios.sort()
            mid = len(ratios) // 2
            median = ratios[mid] if len(ratios) % 2 else (ratios[mid - 1] + ratios[mid]) / 2
            print(f"searches.median_steps_to_reach_vs_grid {median:.3f} (of those that "
                  f"reached it)")
    return 0


def report_search(name: str, search: list[dict], target: float, grid_steps: int,
                  grid_seconds: float) -> float | None:
    """Prints the search's figures (``search.<name>.*``); its steps-to-reach ratio or None."""
    steps = seconds = 0
    reached = None
    for i, t in enumerate(search, 1):
        steps += t["steps"]
        seconds += t["seconds"]
        if reached is None and t["meta_sum"] is not None and t["meta_sum"] >= target:
            reached = (i, t, steps, seconds)
    key = f"search.{name}"
    print(f"{key}.trials {len(search)}")
    best_search = max((t for t in search if t["meta_sum"] is not None),
                      key=lambda t: t["meta_sum"], default=None)
    if best_search is not None:
        print(f"{key}.best_meta_sum {best_search['meta_sum']:.2f}")
        print(f"{key}.best_trial {best_search['trial']} {best_search['mix'].replace(' ', '_')}")
    print(f"{key}.steps_total {steps}")
    print(f"{key}.seconds_total {seconds:.0f}")
    if reached is None:
        print(f"{key}.reached_grid_best no")
        return None
    i, t, s_steps, s_seconds = reached
    print(f"{key}.reached_grid_best yes")
    print(f"{key}.reached_at_trial {i} ({t['trial']} {t['mix'].replace(' ', '_')} "
          f"{t['meta_sum']:.2f})")
    print(f"{key}.steps_to_reach {s_steps}")
    print(f"{key}.seconds_to_reach {s_seconds:.0f}")
    print(f"{key}.ratio.steps_to_reach_vs_grid {s_steps / max(grid_steps, 1):.3f}")
    print(f"{key}.ratio.seconds_to_reach_vs_grid {s_seconds / max(grid_seconds, 1e-9):.3f}")
    return s_steps / max(grid_steps, 1)


if __name__ == "__main__":
    sys.exit(main())
