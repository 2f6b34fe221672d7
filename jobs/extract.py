"""Raw images → image shards, as a Ray job (a `ray job submit` entry point).

    ray job submit --address http://127.0.0.1:8265 --working-dir . -- \
        python jobs/extract.py --images s3://bucket/coco/train2014 --model butd-r101-c4 \
        --weights s3://bucket/weights/butd_r101_c4.pth --source coco --out /shared/data/coco \
        --gpus 8

Same flags as `vlp data extract` (see --help and docs/extract.md). Exits non-zero with a
one-line reason on failure.
"""

import argparse
import sys

from vlp.commands.data.extract import register


def main(argv=None) -> int:
    root = argparse.ArgumentParser(prog="jobs/extract.py")
    register(root.add_subparsers(dest="command", required=True))
    args = root.parse_args(["extract", *(sys.argv[1:] if argv is None else argv)])
    try:
        return args.func(args)
    except Exception as e:  # one line for the job log; VLP_DEBUG=1 python ... for the trace
        import os
        if os.environ.get("VLP_DEBUG"):
            raise
        print(f"extract failed: {type(e).__name__}: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
