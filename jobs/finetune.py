"""Finetune + evaluate a checkpoint on downstream benchmarks (a `ray job submit` entry point).

    ray job submit --address http://127.0.0.1:8265 --working-dir . -- \
        python jobs/finetune.py --config jobs/configs/finetune.yaml --checkpoint PATH

The address is the dashboard, forwarded from the head by `ray dashboard cluster.yaml`
(docs/cluster.md). Same flags as `vlp finetune` (see --help). Prints one figure per line;
exits non-zero with a one-line reason on failure.
"""

import argparse
import sys

from vlp.commands.finetune import add_common, run


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common(p)
    p.add_argument("--list-benchmarks", action="store_true", help="list benchmarks, exit")
    args = p.parse_args(argv)
    try:
        return run(args)
    except Exception as e:  # one line for the job log; VLP_DEBUG=1 python ... for the trace
        import os
        if os.environ.get("VLP_DEBUG"):
            raise
        print(f"finetune failed: {type(e).__name__}: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
