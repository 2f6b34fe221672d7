"""A sweep over pretraining configurations (a `ray job submit` entry point).

    ray job submit --address http://127.0.0.1:8265 --working-dir . -- \
        python jobs/sweep.py --config jobs/configs/table3-uniter-base.yaml

The address is the dashboard, which listens on the head's 127.0.0.1 only: keep `ray
dashboard cluster.yaml` running to forward it (docs/cluster.md). Same flags as `vlp sweep`
(see --help). Inside a Ray job it attaches to the job's cluster; run on a node where `ray
start` runs, to that cluster; elsewhere it starts a private local Ray (RAY_ADDRESS=local
forces one). Prints the leaderboard; exits non-zero
with a one-line reason on failure (130 when interrupted: submit it again to resume).
"""

import argparse
import os
import sys

from vlp.commands.sweep import add_arguments, run


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    args = p.parse_args(argv)
    try:
        if os.environ.get("RAY_ADDRESS"):      # submitted as a job: attach, never start Ray
            import ray

            ray.init()
        return run(args)
    except Exception as e:  # one line for the job log; VLP_DEBUG=1 python ... for the trace
        if os.environ.get("VLP_DEBUG"):
            raise
        print(f"sweep failed: {type(e).__name__}: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
