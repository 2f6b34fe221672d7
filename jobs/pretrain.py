"""Pretrain from an experiment config (a `ray job submit` entry point; also runs standalone:
on a node where `ray start` runs it attaches to that cluster, elsewhere it starts a local
Ray).

    ray job submit --address http://127.0.0.1:8265 --working-dir . -- \\
        python jobs/pretrain.py --config jobs/configs/uniter-base-indomain.yaml
    python jobs/pretrain.py --config jobs/configs/pretrain-tiny.yaml --set train.steps=60

The address is the dashboard, forwarded from the head by `ray dashboard cluster.yaml`
(docs/cluster.md). Same flags as `vlp pretrain` (see --help). Prints the final figures one
per line; exits non-zero with a one-line reason on failure (VLP_DEBUG=1 for the traceback).
"""

import argparse
import sys

from vlp.commands.pretrain import EPILOG, add_arguments, run


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="jobs/pretrain.py", description=__doc__.split("\n\n")[0],
                                epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
