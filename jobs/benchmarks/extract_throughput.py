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
- ``job_steady``: the same job from its first result to its last (actors up): the rate a
  long extraction runs at, where start-up is amortised.

``--mixed-sizes`` times the model alone (the bare loop) on a folder of photos of mixed sizes
(each a different size between 360 and 800 px a side, a third of them portrait) against the
same photos resized to one size (480×640, the old benchmark's), batched alike, in one run,
the passes alternated ``--rounds`` times, A B then B A (a shared machine's load drifts; each
round's ratio is printed, and the 1-minute load average before and after):
``ratio_mixed_over_uniform`` is what one padded canvas per orientation a batch costs against
batches of one shape (padding, masks, per-image RPN and pooling). Random-init weights: the
time does not depend on the weights' values. No Ray is imported; the GPU check
(gpu_check.py's ``extract``) calls ``mixed_vs_uniform`` for butd-r101-c4 at 600/1000.

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
import time
from pathlib import Path

import numpy as np


def _write_images(folder: Path, n: int) -> None:
    from PIL import Image
    rng = np.random.default_rng(0)
    folder.mkdir(parents=True)
    for i in range(n):   # smooth random colour fields: JPEG sizes like photographs'
        small = (rng.random((6, 8, 3)) * 255).astype(np.uint8)
        Image.fromarray(small).resize((640, 480), Image.BICUBIC).save(
            folder / f"img{i:05d}.jpg", quality=90)


def _write_mixed(folder: Path, uniform: Path, n: int) -> None:
    """``n`` photos of ``n`` different sizes (a third portrait) in ``folder``; the same photos
    resized to 480×640 in ``uniform``."""
    from PIL import Image
    rng = np.random.default_rng(1)
    folder.mkdir(parents=True)
    uniform.mkdir(parents=True)
    seen = set()
    for i in range(n):
        while True:
            long, short = int(rng.integers(480, 801)), int(rng.integers(360, 600))
            h, w = (long, short) if i % 3 == 2 else (short, long)
            if (h, w) not in seen:
                seen.add((h, w))
                break
        small = (rng.random((6, 8, 3)) * 255).astype(np.uint8)
        photo = Image.fromarray(small).resize((w, h), Image.BICUBIC)
        photo.save(folder / f"img{i:05d}.jpg", quality=90)
        photo.resize((640, 480), Image.BICUBIC).save(uniform / f"img{i:05d}.jpg", quality=90)


def bare_loop(model: str, settings, files: list[Path], batch: int, threads: int,
              gpu: bool) -> float:
    import torch

    from vlp.models.vision.extractors.registry import build_extractor
    from vlp.platform.extract.decode_stage import decode_rgb

    torch.set_num_threads(threads)
    device = torch.device("cuda" if gpu else "cpu")
    ext = build_extractor(model, None, settings).to(device).eval()
    decoded = [decode_rgb(f.read_bytes()) for f in files]
    prepared = [ext.prepare(im) for im in decoded]
    inputs = [torch.from_numpy(x).to(device) for x, _ in prepared]
    ext.extract(inputs[:batch], [s for _, s in prepared[:batch]],
                [im.shape[:2] for im in decoded[:batch]])            # warm-up
    if gpu:
        torch.cuda.synchronize()
    start = time.perf_counter()
    for i in range(0, len(inputs), batch):
        ext.extract(inputs[i:i + batch], [s for _, s in prepared[i:i + batch]],
                    [im.shape[:2] for im in decoded[i:i + batch]])
    if gpu:
        torch.cuda.synchronize()
    return len(inputs) / (time.perf_counter() - start)


def interleaved(model: str, settings, folders: list[list[Path]], batch: int, threads: int,
                gpu: bool, rounds: int) -> tuple[list[float], list[list[float]]]:
    """Images/s of the model alone on each list of files, the passes alternated ``rounds``
    times, in turn forwards and backwards (A B B A ...; one model, each list decoded and
    warmed up first), so a machine whose load drifts slows every list alike. Returns the
    rates over all rounds and each round's rates (in the lists' order).

    Warm-up: on a GPU one untimed pass over every batch (each canvas shape's first call pays
    the allocator's growth and kernel choices once; a long extraction meets its few hundred
    canvas shapes early on and then only those); on a CPU the first batch (a pass of a
    ResNet-101 at 600×1000 costs minutes there)."""
    import torch

    from vlp.models.vision.extractors.registry import build_extractor
    from vlp.platform.extract.decode_stage import decode_rgb

    torch.set_num_threads(threads)
    device = torch.device("cuda" if gpu else "cpu")
    ext = build_extractor(model, None, settings).to(device).eval()
    sets = []
    for files in folders:
        decoded = [decode_rgb(f.read_bytes()) for f in files]
        prepared = [ext.prepare(im) for im in decoded]
        inputs = [torch.from_numpy(np.array(x)).to(device) for x, _ in prepared]
        scales = [s for _, s in prepared]
        sizes = [im.shape[:2] for im in decoded]
        for i in range(0, len(inputs) if gpu else batch, batch):             # warm-up
            ext.extract(inputs[i:i + batch], scales[i:i + batch], sizes[i:i + batch])
        sets.append((inputs, scales, sizes))
    seconds = [0.0] * len(sets)
    per_round: list[list[float]] = []
    for r in range(rounds):
        row = [0.0] * len(sets)
        # A B, then B A: a load that rises or falls steadily over a pair of rounds costs
        # every list alike (A B A B would charge the drift to B each round)
        for k in (range(len(sets)) if r % 2 == 0 else reversed(range(len(sets)))):
            inputs, scales, sizes = sets[k]
            if gpu:
                torch.cuda.synchronize()
            start = time.perf_counter()
            for i in range(0, len(inputs), batch):
                ext.extract(inputs[i:i + batch], scales[i:i + batch], sizes[i:i + batch])
            if gpu:
                torch.cuda.synchronize()
            took = time.perf_counter() - start
            seconds[k] += took
            row[k] = len(inputs) / took
        per_round.append(row)
    return [rounds * len(s[0]) / t for s, t in zip(sets, seconds)], per_round


def mixed_vs_uniform(model: str, settings, images: int, batch: int, threads: int, gpu: bool,
                     rounds: int) -> dict:
    """The ``--mixed-sizes`` figures as a dict (the GPU check records them too): images/s of
    the model alone on ``images`` photos of mixed sizes and on the same photos resized to
    480×640, passes alternated ``rounds`` times in this process; resized Mpixel per image of
    each folder; the two ratios; the 1-minute load average before and after (a shared
    machine's rates move with it, the ratio much less)."""
    from PIL import Image

    from vlp.models.vision.extractors.base import resized_hw

    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        mixed, uniform = Path(tmp) / "mixed", Path(tmp) / "uniform"
        _write_mixed(mixed, uniform, images)
        (rate_uniform, rate_mixed), per_round = interleaved(
            model, settings, [sorted(uniform.glob("*.jpg")), sorted(mixed.glob("*.jpg"))],
            batch, threads, gpu, rounds)
        # BUTD's resize keeps the aspect: mixed aspects give other pixel counts than 4:3, so
        # the rate per resized pixel is given too (the canvas' padding is the difference)
        area = {name: float(np.mean([np.prod(resized_hw(*Image.open(f).size[::-1],
                                                        settings)[:2])
                                     for f in folder.glob("*.jpg")])) / 1e6
                for name, folder in (("uniform", uniform), ("mixed", mixed))}
    return {"model": model, "images": images, "batch": batch, "rounds": rounds,
            "uniform_images_per_s": rate_uniform, "mixed_images_per_s": rate_mixed,
            "uniform_mpixel_per_image": area["uniform"], "mixed_mpixel_per_image": area["mixed"],
            "ratio_mixed_over_uniform": rate_mixed / rate_uniform,
            "ratio_mixed_over_uniform_per_pixel":
                rate_mixed * area["mixed"] / (rate_uniform * area["uniform"]),
            "round_ratios": [m / u for u, m in per_round],
            "load_average_before": load_before, "load_average_after": os.getloadavg()[0]}


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
        _write_images(folder, args.images)
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

        opts = ExtractOptions(images=str(folder), image_list=None, model=args.model,
                              weights="random", source="bench", split="train",
                              out=str(Path(tmp) / "world"), settings=settings,
                              batch_size=args.batch_size, gpus=args.gpus,
                              workers=args.workers)
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
