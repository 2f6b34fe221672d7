"""The extractor's own rate, without Ray: images/s of a model over images already decoded
(``bare_loop``), two image sets timed in alternated passes (``interleaved``), and photos of
mixed sizes against the same photos resized to one size (``mixed_vs_uniform``: what one
padded canvas per orientation a batch costs). jobs/benchmarks/extract_throughput.py prints
them; the GPU check (``vlp.platform.gpu_check``) records ``mixed_vs_uniform``. Random-texture
JPEGs written here: the time does not depend on the pixels' values."""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import numpy as np


def write_images(folder: Path, n: int) -> None:
    from PIL import Image
    rng = np.random.default_rng(0)
    folder.mkdir(parents=True)
    for i in range(n):   # smooth random colour fields: JPEG sizes like photographs'
        small = (rng.random((6, 8, 3)) * 255).astype(np.uint8)
        Image.fromarray(small).resize((640, 480), Image.BICUBIC).save(
            folder / f"img{i:05d}.jpg", quality=90)


def write_mixed(folder: Path, uniform: Path, n: int) -> None:
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
        write_mixed(mixed, uniform, images)
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
