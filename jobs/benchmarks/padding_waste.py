"""Padding waste of the pipeline's batches, with and without length bucketing.

    python jobs/benchmarks/padding_waste.py [--world DIR] [--scale demo] [--epochs 2]

Runs the pipeline's own batcher (the plain local stream: the batches are the same as under
Ray) over the world's pretraining sources for a few epochs, with the default region
selection and with BUTD's fixed 36, and reports for each:

- the padding share of the input units: 1 − Σ real (text + regions) / Σ input_units, where a
  batch's input units are examples × its longest packed row (UNITER's unit; the model packs
  text and regions per row);
- the same for separately padded tensors (examples × (max text + max regions)), i.e. the
  host→device bytes;
- the mean batch fill (input units / budget) and examples per batch.

One figure per line, the ratio (waste with / without bucketing, default selection) last.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from vlp.contract import batch_spec as K
from vlp.datasets.stream.data_config import DataConfig, RegionConfig, world_sources
from vlp.datasets.stream.data_plan import plan_data
from vlp.datasets.stream.local_stream import local_batches


def figure(name: str, value: float, unit: str = "") -> None:
    print(f"{name} {value:.4g} {unit}".rstrip(), flush=True)


def measure(cfg: DataConfig, epochs: int) -> dict[str, float]:
    plan = plan_data(cfg, {"mlm": 1})
    src = local_batches(plan)
    real = packed = separate = examples = batches = 0
    while True:
        b = src.next("mlm")
        if src.epoch >= epochs:
            break
        t, r = b[K.TEXT_MASK].sum(1), b[K.REGION_MASK].sum(1)
        n = int(b[K.NUM_EXAMPLES])
        real += int((t + r).sum())
        packed += int(b[K.INPUT_UNITS])
        separate += n * (int(t.max()) + int(r.max()))
        examples += n
        batches += 1
    src.close()
    return {"waste_packed": 1 - real / packed, "waste_separate": 1 - real / separate,
            "fill": packed / batches / cfg.batch_units, "examples_per_batch": examples / batches}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--world", type=Path, default=None)
    p.add_argument("--scale", default="demo")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-units", type=int, default=4096)
    p.add_argument("--bucket-window", type=int, default=4096)
    args = p.parse_args(argv)
    from vlp.testing.bench_worlds import ensure_world
    world = ensure_world(args.world, args.scale)
    base = dict(sources=world_sources(str(world)), batch_units=args.batch_units,
                bucket_window=args.bucket_window)
    print(f"# world {world}; batch_units={args.batch_units} bucket_window={args.bucket_window}")
    results = {}
    for name, kw in [("bucketed", {}), ("unbucketed", {"bucketing": False}),
                     ("bucketed_fixed36", {"regions": RegionConfig(fixed_regions=36)}),
                     ("unbucketed_fixed36", {"regions": RegionConfig(fixed_regions=36),
                                             "bucketing": False})]:
        r = measure(DataConfig(**base, **kw), args.epochs)
        results[name] = r
        figure(f"{name}_padding_waste", r["waste_packed"])
        figure(f"{name}_padding_waste_separate_tensors", r["waste_separate"])
        figure(f"{name}_batch_fill", r["fill"])
        figure(f"{name}_examples_per_batch", r["examples_per_batch"])
    figure("ratio_waste_bucketed_to_unbucketed",
           results["bucketed"]["waste_packed"] / results["unbucketed"]["waste_packed"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
