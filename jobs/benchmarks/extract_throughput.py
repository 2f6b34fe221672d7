"""Images/s of `vlp data extract` (the Ray Data job) against a bare loop of the same model on
the same decoded images, in one run.

    python jobs/benchmarks/extract_throughput.py [--model grid-r50] [--images 96]
        [--short-side 224] [--long-side 320] [--workers 2] [--gpus 0] [--batch-size 4]
        [--bare-only]

- ``bare_loop``: the extractor in this process, ``extract`` over the images already decoded
  and prepared (``prepare``), ``--batch-size`` at a time; torch gets as many threads as the
  job has CPU actors (on a GPU: one GPU, inputs already on it). Decoding is not counted.
- ``job``: the whole job (`plan` done before timing, Ray started before timing): read the
  files, decode + prepare, the model in the actor pool, shards written and the manifest
  updated; from the first dataset block to the last shard, so actor start-up counts.
- ``job_steady``: the model stage's rate inside the job, as its actors timed it: the images
  after each actor's first batch over their first start to their last end (actors up and
  warm; not the driver's result arrivals, which come a shard at a time and in bursts): the
  rate a long extraction runs at, where start-up is amortised.

``--mixed-sizes`` times the model alone (the bare loop) on a folder of photos of mixed sizes
(each a different size between 360 and 800 px a side, a third of them portrait) against the
same photos resized to one size (480×640, the old benchmark's), batched alike, in one run,
the passes alternated ``--rounds`` times, A B then B A (a shared machine's load drifts; each
round's ratio is printed, and the 1-minute load average before and after):
``ratio_mixed_over_uniform`` is what one padded canvas per orientation a batch costs against
batches of one shape (padding, masks, per-image RPN and pooling). Random-init weights: the
time does not depend on the weights' values. No Ray is imported; the GPU check
(``vlp.platform.gpu_check``'s ``extract``) calls ``model_rate.mixed_vs_uniform`` for butd-r101-c4 at 600/1000.

``--bare-only`` times the bare loop alone and imports no Ray: the per-GPU model rate on a GPU
machine that has torch but no Ray (BUTD's settings: ``--model butd-r101-c4 --short-side 600
--long-side 1000 --gpus 1 --bare-only``).

Goal on CPU: job ≥ 0.9 × bare loop (steady state). Prints settings, then one figure per line
(``name value unit``), the ratio last. Images are random-texture JPEGs of 480×640.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from vlp.platform.extract.model_rate import bare_loop, mixed_vs_uniform, write_images


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="grid-r50")
    p.add_argument("--images", type=int, default=160)
    p.add_argument("--short-side", type=int, default=224)
    p.add_argument("--long-side", type=int, default=320)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--gpus", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--images-per-shard", type=int, default=0,
                   help="the job's shard size (0: an eighth of --images, at least a batch): "
                        "shards written while the model works, as in a long job")
    p.add_argument("--bare-only", action="store_true",
                   help="time the bare loop alone (no Ray imported)")
    p.add_argument("--rounds", type=int, default=2,
                   help="--mixed-sizes: alternated timed passes over each folder")
    p.add_argument("--mixed-sizes", action="store_true",
                   help="time the model alone on mixed sizes against one size (no Ray)")
    args = p.parse_args(argv)
    if args.mixed_sizes:
        return mixed_sizes(args)

    from vlp.models.vision.extractors.base import ExtractSettings

    settings = ExtractSettings(short_side=args.short_side, long_side=args.long_side)
    actors = args.gpus or args.workers
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "images"
        write_images(folder, args.images)
        files = sorted(folder.glob("*.jpg"))
        print(f"settings: model {args.model}, {args.images} images 480x640 → "
              f"{args.short_side}/{args.long_side}, batch {args.batch_size}, "
              f"{args.rounds} alternated rounds, "
              f"{f'{args.gpus} GPU' if args.gpus else f'{args.workers} CPU'} actor(s)")
        bare = bare_loop(args.model, settings, files, args.batch_size,
                         threads=max(1, args.workers), gpu=bool(args.gpus))
        if args.bare_only:
            import torch
            device = torch.cuda.get_device_name(0) if args.gpus else "cpu"
            print(f"device {device}")
            print(f"bare_loop {bare:.2f} images/s{' per GPU' if args.gpus else ''}")
            return 0
        from vlp.platform.cluster.ray_session import ensure_ray
        from vlp.platform.extract.extract_job import ExtractOptions, plan, run

        # shards written while the model works, as in a long job (one shard of the default
        # 1,000 images, above a benchmark's count, would be written after the last image)
        per_shard = args.images_per_shard or max(args.batch_size, args.images // 8)
        opts = ExtractOptions(images=str(folder), image_list=None, model=args.model,
                              weights="random", source="bench", split="train",
                              out=str(Path(tmp) / "world"), settings=settings,
                              batch_size=args.batch_size, gpus=args.gpus,
                              workers=args.workers, images_per_shard=per_shard)
        job_plan = plan(opts)
        ensure_ray(cpus_wanted=(0 if args.gpus else args.workers) + 1)
        report = run(job_plan, progress_every_s=1e9)
        if report.failed or report.written != args.images:
            print(f"job wrote {report.written} of {args.images} images: {report.failed[:3]}",
                  file=sys.stderr)
            return 1
        per = "per GPU" if args.gpus else "total"
        print(f"bare_loop {bare:.2f} images/s")
        print(f"job {report.images_per_s:.2f} images/s ({per}: "
              f"{report.images_per_s / actors if args.gpus else report.images_per_s:.2f})")
        print(f"job_steady {report.steady_images_per_s:.2f} images/s")
        print(f"job_seconds {report.seconds:.1f} s")
        print(f"ratio_job_steady_over_bare_loop {report.steady_images_per_s / bare:.3f}")
        print(f"ratio_job_over_bare_loop {report.images_per_s / bare:.3f}")
    return 0


def _cpu_name(fallback: str) -> str:
    """The CPU's model name as lscpu prints it (Linux), else ``fallback``."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()} ({os.cpu_count()} CPUs)"
    except OSError:
        pass
    return fallback or "cpu"


def mixed_sizes(args) -> int:
    import platform

    import torch

    from vlp.models.vision.extractors.base import ExtractSettings

    settings = ExtractSettings(short_side=args.short_side, long_side=args.long_side)
    gpu = bool(args.gpus)
    device = torch.cuda.get_device_name(0) if gpu else _cpu_name(platform.processor())
    print(f"settings: model {args.model} (random-init weights), {args.images} images, "
          f"mixed sizes 360-800 px (a third portrait) vs all 480x640, resized to "
          f"{args.short_side}/{args.long_side}, batch {args.batch_size}, "
          f"{args.rounds} alternated rounds, "
          f"{'1 GPU' if gpu else f'{args.workers} CPU thread(s)'}")
    print(f"device {device}", flush=True)
    f = mixed_vs_uniform(args.model, settings, args.images, args.batch_size,
                         max(1, args.workers), gpu, args.rounds)
    print(f"load_average {f['load_average_before']:.2f} before, "
          f"{f['load_average_after']:.2f} after (1 min)")
    print(f"uniform {f['uniform_images_per_s']:.3f} images/s")
    print(f"mixed {f['mixed_images_per_s']:.3f} images/s")
    print(f"uniform_resized {f['uniform_mpixel_per_image']:.3f} Mpixel/image")
    print(f"mixed_resized {f['mixed_mpixel_per_image']:.3f} Mpixel/image")
    print(f"round_ratios {' '.join(f'{r:.3f}' for r in f['round_ratios'])}")
    print(f"ratio_mixed_over_uniform {f['ratio_mixed_over_uniform']:.3f}")
    print(f"ratio_mixed_over_uniform_per_pixel {f['ratio_mixed_over_uniform_per_pixel']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
