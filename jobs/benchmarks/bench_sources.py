"""Image shards shaped like a real UNITER job's, for speed measurements: BUTD-like region
counts (10–100 per image, UNITER's adaptive range), 2048-d fp16 features, soft labels over
Visual Genome's 1,601 classes, and COCO-length captions (5 per image, 8–16 common words).
The content is random: what a step costs depends on the shapes, not on what they hold.

The synthetic world (``vlp data synth``) is built to teach grounding on a CPU, not to look
like real data to a GPU: its rows are 8–30 units long (4–13 words, 4–10 regions of 64-d
features) and its tiny scale has a few hundred pairs, so a 10,240-unit batch holds half of
it and length-bucketing has nothing to sort. A real COCO+VG row is ~50–115 units.

    python jobs/benchmarks/bench_sources.py OUT [--images 3000]   # OUT/images/{coco,vg}/
"""

from __future__ import annotations

import argparse
import sys

from vlp.datasets.synth.real_shapes import FEATURE_EXTRACTOR, region_counts, write_bench_sources

__all__ = ["FEATURE_EXTRACTOR", "region_counts", "write_bench_sources"]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", help="folder to write images/<source>/part-*.parquet into")
    p.add_argument("--images", type=int, default=3000)
    p.add_argument("--feature-dim", type=int, default=2048)
    p.add_argument("--num-classes", type=int, default=1601)
    args = p.parse_args(argv)
    for source, folder in write_bench_sources(args.out, args.images, args.feature_dim,
                                              args.num_classes).items():
        print(f"{source} {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
