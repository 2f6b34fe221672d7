"""`vlp data extract`: raw images → region/grid features (or pixels) in image shards."""

from __future__ import annotations

import argparse
import sys

_EPILOG = """\
From a folder of images and captions to a world in two commands (COCO + Karpathy):

  vlp data extract --images coco/train2014 --model butd-r101-c4 \\
      --weights butd_r101_c4.pth --source coco --out data/coco --gpus 4
  vlp data import karpathy dataset_coco.json --out data/coco

Image ids are the file names' stems in the importers' spelling (COCO_train2014_000000391895.jpg
→ 391895), so caption and task imports bind to the extracted rows. Shards are written one by
one to OUT/images/SOURCE/SPLIT-NNNNN.parquet (atomic, validated, content-hashed) and listed in
OUT/manifest.json as they finish; every shard's metadata records the extractor, its settings
and the weights' sha256. Rerun after an interruption: images already in OUT/images/SOURCE are
skipped. An image that cannot be read or decoded is one line of the report at the end; the
others go on. Exit status: 0 every image written, 3 finished with failed images (listed),
2 refused before start (one line), 1 the job failed. See docs/extract.md.
"""


def register(sub) -> None:
    from vlp.models.vision.extractors.registry import EXTRACTORS
    from vlp.models.vision.extractors.base import ExtractSettings

    d = ExtractSettings()
    p = sub.add_parser("extract", help="extract region/grid features from raw images (Ray Data)",
                       description="Run an image feature extractor over a folder of images as "
                                   "a Ray Data batch-inference job (decode and resize on CPU "
                                   "tasks, the model in an actor pool) and write the results "
                                   "as image shards of a data folder.",
                       epilog=_EPILOG + "\nmodels:\n" + "\n".join(
                           f"  {e.name:<14} {e.summary}" for e in EXTRACTORS.values()),
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--images", metavar="DIR|URI",
                     help="folder of image files, searched recursively (local or s3://...)")
    src.add_argument("--image-list", metavar="FILE",
                     help="text file with one image path or URI a line (relative paths: "
                          "relative to the file)")
    p.add_argument("--model", required=True, metavar="NAME",
                   help=f"extractor: {', '.join(EXTRACTORS)}")
    p.add_argument("--weights", default="random", metavar="PATH|URI|random",
                   help="weights file (butd: converted detectron2 BUTD checkpoint; grid: a "
                        "torchvision ResNet state dict), or random (tests) (default: random)")
    p.add_argument("--source", required=True,
                   help="corpus name; shards go to OUT/images/SOURCE/ (coco, vg, flickr30k, ...)")
    p.add_argument("--split", default="train", choices=["train", "val", "test"],
                   help="split of every image (a Karpathy caption import sets it per image "
                        "later) (default: train)")
    p.add_argument("--out", required=True, metavar="DATA_FOLDER",
                   help="the data folder (world) to write into; created if missing")
    p.add_argument("--boxes", metavar="mattnet:DATASET|PARQUET",
                   help="featurise these boxes instead of the model's own regions (detectors "
                        "only: RoI pooling and head on them, no RPN, NMS or confidence "
                        "filter; each image's boxes written in the given order): "
                        "mattnet:refcoco+ (the detections `vlp data import mattnet-dets` put "
                        "in --out), or a Parquet of image_id, boxes (x1, y1, x2, y2 in the "
                        "original image's pixels); every image extracted needs boxes")
    p.add_argument("--min-boxes", type=int, default=d.min_boxes,
                   help=f"fewest regions per image (default: {d.min_boxes})")
    p.add_argument("--max-boxes", type=int, default=d.max_boxes,
                   help=f"most regions per image (default: {d.max_boxes})")
    p.add_argument("--conf-threshold", type=float, default=d.conf_threshold,
                   help=f"detector: keep regions at least this confident (default: "
                        f"{d.conf_threshold})")
    p.add_argument("--nms-threshold", type=float, default=d.nms_threshold,
                   help=f"detector: per-class NMS IoU (default: {d.nms_threshold})")
    p.add_argument("--short-side", type=int, default=d.short_side,
                   help=f"resize the shorter side to this (default: {d.short_side})")
    p.add_argument("--long-side", type=int, default=d.long_side,
                   help=f"... unless the longer side would pass this (default: {d.long_side})")
    p.add_argument("--grid", type=int, default=d.grid,
                   help=f"grid models: G×G cells (default: {d.grid})")
    p.add_argument("--batch-size", type=int, default=4,
                   help="images per model call (and per decode task) (default: 4)")
    pool = p.add_mutually_exclusive_group()
    pool.add_argument("--gpus", type=int, default=0, metavar="N",
                      help="N model actors, one GPU each")
    pool.add_argument("--workers", type=int, default=1, metavar="N",
                      help="N model actors on CPUs, one CPU each (default: 1)")
    p.add_argument("--images-per-shard", type=int, default=1000,
                   help="images per shard file: what an interruption can cost (default: 1000)")
    p.add_argument("--check", action="store_true",
                   help="check inputs, weights and the output folder, print what would run, "
                        "and stop without writing anything")
    p.set_defaults(func=run)


def options_from(args: argparse.Namespace):
    from vlp.models.vision.extractors.base import ExtractSettings
    from vlp.platform.extract.extract_job import ExtractOptions

    settings = ExtractSettings(min_boxes=args.min_boxes, max_boxes=args.max_boxes,
                               conf_threshold=args.conf_threshold,
                               nms_threshold=args.nms_threshold, short_side=args.short_side,
                               long_side=args.long_side, grid=args.grid)
    return ExtractOptions(images=args.images, image_list=args.image_list, model=args.model,
                          weights=args.weights, source=args.source, split=args.split,
                          out=args.out, settings=settings, batch_size=args.batch_size,
                          gpus=args.gpus, workers=args.workers,
                          images_per_shard=args.images_per_shard, boxes=args.boxes)


def run(args: argparse.Namespace) -> int:
    from vlp.platform.extract.extract_job import (JobFailed, check_cluster, plan,
                                                  run as run_job, summary)

    try:
        p = plan(options_from(args))
    except (ValueError, FileNotFoundError) as e:
        print(f"vlp data extract: error: {e}", file=sys.stderr)
        return 2
    print(p.describe(), flush=True)
    if args.check:
        return 0
    from vlp.platform.cluster.ray_session import ensure_ray
    # the job's cluster (`ray job submit`, `ray start`) or a local instance with a CPU per
    # actor and one for the decode tasks
    ensure_ray(cpus_wanted=(0 if args.gpus else args.workers) + 1)
    try:
        check_cluster(p.options)
    except ValueError as e:
        print(f"vlp data extract: error: {e}", file=sys.stderr)
        return 2
    try:
        report = run_job(p)
    except JobFailed as e:
        print(f"vlp data extract: error: {e}", file=sys.stderr)
        return 1
    for line in report.failed:
        print(f"extract: failed: {line}", file=sys.stderr)
    print(summary(p, report), flush=True)
    # 3: the job finished but some images are not in the shards (each is a line above)
    return 3 if report.failed else 0
