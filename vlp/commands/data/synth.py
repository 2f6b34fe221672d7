"""`vlp data synth --out DIR --scale {tiny,demo,full} --seed N`: generate the synthetic world."""

from __future__ import annotations

import argparse


def register(sub) -> None:
    from vlp.datasets.synth.scales import SCALES

    sizes = "; ".join(f"{s.name}: {s.total_images} images, D={s.feature_dim}, "
                      f"{s.image_size}px" for s in SCALES.values())
    p = sub.add_parser(
        "synth", help="generate the synthetic V+L world (pretraining corpora + benchmarks)",
        description="Generate a synthetic vision-language world: rendered scenes, a simulated "
                    "detector's boxes / region features / soft class labels, pretraining "
                    "captions in UNITER's four styles (coco, vg in-domain; cc, sbu "
                    "out-of-domain with noisy and unrelated alt-text) and six downstream "
                    "benchmarks (vqa, retrieval, nlvr2, ve, refexp, vcr) on disjoint images. "
                    "The world is written to a temporary folder beside OUT and renamed into "
                    "place when complete. Same scale + seed = byte-identical files.")
    p.add_argument("--out", required=True, metavar="DIR",
                   help="folder to create (must not exist, be empty, or hold a world you "
                        "replace with --overwrite)")
    p.add_argument("--scale", choices=sorted(SCALES), default="demo",
                   help=f"how big a world (default demo): {sizes}")
    p.add_argument("--seed", type=int, default=0,
                   help="random seed (default 0) of the scenes, text and detector noise "
                        "(the detector's feature network is fixed per feature width, so "
                        "seeds share a feature space)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing world at DIR (only a folder with a "
                        "manifest.json is ever replaced)")
    p.add_argument("--no-progress", action="store_true", help="do not show a progress bar")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import signal
    import sys
    import time

    from vlp.datasets.synth import generate_world
    from vlp.datasets.storage.world import load_manifest

    # a polite kill (SIGTERM) unwinds like Ctrl-C, so the half-built temporary folder is removed
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    start = time.perf_counter()
    root = generate_world(args.out, scale=args.scale, seed=args.seed,
                          overwrite=args.overwrite, progress=not args.no_progress)
    m = load_manifest(root)
    took = time.perf_counter() - start
    pairs = sum(s.pairs for s in m.sources.values())
    images = sum(s.images for s in m.sources.values())
    print(f"wrote {m.name} to {root} in {took:.1f}s: {images} images, {pairs} pretraining "
          f"pairs, D={m.feature_dim}, C={m.num_classes}, detector top-1 "
          f"{m.stats['detector_top1']:.3f}")
    for task, rows in m.task_rows.items():
        print(f"  {task:<10}" + "  ".join(f"{s}={n}" for s, n in sorted(rows.items())))
    return 0
