"""Benchmark of the synthetic world: generation time and size per scale, the simulated
detector's top-1 accuracy, and linear probes that recover object class (shape), colour and
material from region features (train on pretraining-image regions, test on downstream test
regions), including a learning curve over training-set sizes.

Prints one figure per line: ``name value [unit]``. Run:

    python jobs/benchmarks/synth_world.py --scales tiny demo [--probe-scale demo] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import torch

from vlp.datasets.synth import generate_world
from vlp.datasets.storage.world import load_manifest

ATTRIBUTES = ("class", "colour", "material", "size")


def figure(name: str, value, unit: str = "") -> None:
    print(f"{name} {value}{' ' + unit if unit else ''}", flush=True)


def region_dataset(root: Path, sources: list[str], split: str | None = None
                   ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Features of regions that cover one object (IoU ≥ 0.5), with that object's attributes."""
    m = load_manifest(root)
    feats, labels = [], {a: [] for a in ATTRIBUTES}
    for source in sources:
        truth = {}
        with open(root / "scenes" / f"{source}.jsonl") as f:
            for line in f:
                rec = json.loads(line)
                truth[rec["image_id"]] = rec
        for path in m.image_files(source, split):
            table = pq.read_table(path, columns=["image_id", "features"])
            for iid, blob in zip(table.column("image_id").to_pylist(),
                                 table.column("features").to_pylist()):
                x = np.frombuffer(blob, "<f2").reshape(-1, m.feature_dim)
                rec = truth[iid]
                for r, region in enumerate(rec["regions"]):
                    if region["object"] >= 0:
                        obj = rec["objects"][region["object"]]
                        feats.append(x[r])
                        for a in ATTRIBUTES:
                            labels[a].append(obj[a])
    vocab = m.vocabulary
    names = {"class": vocab["classes"], "colour": vocab["colours"],
             "material": vocab["materials"], "size": vocab["sizes"]}
    return (np.stack(feats).astype(np.float32),
            {a: np.array([names[a].index(v) for v in labels[a]]) for a in ATTRIBUTES})


def linear_probe(x_tr: np.ndarray, y_tr: np.ndarray, x_te: np.ndarray, y_te: np.ndarray,
                 classes: int, l2: float = 1e-3) -> float:
    """Multinomial logistic regression (L-BFGS, standardised inputs); test accuracy."""
    torch.manual_seed(0)
    mu, sd = x_tr.mean(0), x_tr.std(0) + 1e-6
    a = torch.tensor((x_tr - mu) / sd)
    b = torch.tensor((x_te - mu) / sd)
    ya = torch.tensor(y_tr)
    w = torch.zeros(a.shape[1], classes, requires_grad=True)
    bias = torch.zeros(classes, requires_grad=True)
    opt = torch.optim.LBFGS([w, bias], max_iter=300, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(a @ w + bias, ya) + l2 * (w ** 2).sum()
        loss.backward()
        return loss
    opt.step(closure)
    with torch.no_grad():
        return float(((b @ w + bias).argmax(1).numpy() == y_te).mean())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scales", nargs="+", default=["tiny", "demo"],
                   help="scales to generate and time (full writes ~2 GB)")
    p.add_argument("--probe-scale", default="demo", help="scale whose features are probed")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=None,
                   help="where to write the worlds (default: a temporary folder)")
    args = p.parse_args(argv)
    torch.set_num_threads(2)
    with tempfile.TemporaryDirectory() as tmp:
        base = args.out or Path(tmp)
        worlds = {}
        for scale in args.scales:
            start, cpu = time.perf_counter(), time.process_time()
            root = generate_world(base / f"{scale}-seed{args.seed}", scale=scale,
                                  seed=args.seed, overwrite=True)
            figure(f"synth_seconds_{scale}", round(time.perf_counter() - start, 2), "s")
            # CPU time as well: on a shared machine wall time measures the neighbours too
            figure(f"synth_cpu_seconds_{scale}", round(time.process_time() - cpu, 2), "s")
            m = load_manifest(root)
            worlds[scale] = root
            size = sum(f.stat().st_size for f in root.rglob("*") if f.is_file())
            figure(f"world_mb_{scale}", round(size / 2 ** 20, 1), "MiB")
            figure(f"images_{scale}", sum(s.images for s in m.sources.values()))
            figure(f"pretraining_images_{scale}",
                   sum(m.sources[s].images for s in m.pretraining_sources()))
            figure(f"pretraining_pairs_{scale}",
                   sum(m.sources[s].pairs for s in m.pretraining_sources()))
            for task, rows in m.task_rows.items():
                figure(f"{task}_rows_train_{scale}", rows["train"])
            figure(f"feature_dim_{scale}", m.feature_dim)
            figure(f"detector_top1_{scale}", m.stats["detector_top1"])
            figure(f"regions_per_image_{scale}", m.stats["regions_per_image"])
        if args.probe_scale not in worlds:
            return 0
        root = worlds[args.probe_scale]
        x_tr, y_tr = region_dataset(root, ["coco", "vg"])
        x_te, y_te = region_dataset(root, ["downstream"], "test")
        figure("probe_train_regions", len(x_tr))
        figure("probe_test_regions", len(x_te))
        m = load_manifest(root)
        k = {"class": len(m.vocabulary["classes"]), "colour": len(m.vocabulary["colours"]),
             "material": len(m.vocabulary["materials"]), "size": len(m.vocabulary["sizes"])}
        rng = np.random.default_rng(0)
        for attr in ATTRIBUTES:
            majority = float(np.bincount(y_te[attr], minlength=k[attr]).max() / len(x_te))
            figure(f"probe_{attr}_chance_uniform", round(1 / k[attr], 3))
            figure(f"probe_{attr}_chance_majority", round(majority, 3))
            for n in (200, 2000, len(x_tr)):
                idx = rng.permutation(len(x_tr))[:n]
                acc = linear_probe(x_tr[idx], y_tr[attr][idx], x_te, y_te[attr], k[attr])
                figure(f"probe_{attr}_acc_n{'all' if n == len(x_tr) else n}", round(acc, 3))
    return 0


if __name__ == "__main__":
    sys.exit(main())
