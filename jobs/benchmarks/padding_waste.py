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

``--real-shapes`` measures ``data.fixed_shapes`` instead, on shards shaped like a real UNITER
job's (``bench_sources.py``; 10,240-unit batches, UNITER's mix), for each ladder size in
``--buckets``: the distinct shapes per task over ``--batches`` batches (cut by the batcher's
own window from the rows' lengths), the padding share of the input units with fixed shapes
(in all: within rows and empty rows) and as batched without them (today), the share the fixed
shapes add (the difference, in points of input units), and the floor: the padding of the best
``k`` widths for the same rows with every batch full; then, over ``--built``
batches built whole, the share of the target lists (MLM_TARGETS, REGION_TARGETS) that is
padding.

    python jobs/benchmarks/padding_waste.py --real-shapes [--batches 1000] [--buckets 8 12 16]
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


def fixed_shape_figures(world: Path, batches: int, buckets: list[int], built: int) -> None:
    from vlp.datasets.batching.image_block import ImageBlock
    from vlp.datasets.batching.shape_census import census, width_census
    from vlp.datasets.batching.task_sampler import TaskSampler
    from vlp.datasets.stream.data_config import SourceConfig
    from vlp.datasets.stream.local_stream import local_blocks

    mix = {"mlm": 2, "itm": 2, "mrfr": 1, "mrc-kl": 1}   # UNITER's in-domain mix
    sources = tuple(SourceConfig(s, str(world / "images" / s)) for s in ("coco", "vg"))
    blocks = None
    today = None
    for k in buckets:
        cfg = DataConfig(sources=sources, batch_units=10240, bucket_window=10240,
                         fixed_shapes=True, shape_buckets=k)
        plan = plan_data(cfg, mix)
        if blocks is None:
            blocks = [ImageBlock.from_table(t, plan.feature_dim, plan.num_classes, plan.loc_dim)
                      for t in local_blocks(plan)(0)]
        if today is None:   # today's batching (no fixed shapes) of the same rows
            plain = plan_data(DataConfig(sources=sources, batch_units=10240,
                                         bucket_window=10240), mix)
            today, _ = width_census(plain, blocks, TaskSampler(mix), batches)
            figure("today_padding_share", today.padding)
            figure("today_most_shapes_per_task", today.figures()["most_shapes_per_task"])
        c, shapes = width_census(plan, blocks, TaskSampler(mix), batches)
        print(f"# shape_buckets={k}: widths {list(shapes.widths)}")
        for name, value in c.figures().items():
            figure(f"buckets{k}_{name}", value)
        figure(f"buckets{k}_padding_floor", c.floor(k))
        figure(f"buckets{k}_padding_added_share", c.padding - today.padding)
        figure(f"buckets{k}_ratio_padding_fixed_to_today", c.padding / today.padding)
    if built:
        src = local_batches(plan)
        c = census(TaskSampler(mix), src, built)
        src.close()
        for key in (K.MLM_TARGETS, K.REGION_TARGETS):
            figure(f"built{built}_{key}_padding_share", c.figures()[f"{key}_padding_share"])
        figure(f"built{built}_padding_share", c.padding)
        figure(f"built{built}_most_shapes_per_task", c.most_shapes())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--real-shapes", action="store_true",
                   help="measure data.fixed_shapes on real-shape shards (bench_sources.py)")
    p.add_argument("--batches", type=int, default=1000)
    p.add_argument("--buckets", type=int, nargs="+", default=[8, 12, 16])
    p.add_argument("--built", type=int, default=120,
                   help="batches built whole for the targets' padding (0: none)")
    p.add_argument("--images", type=int, default=3000)
    p.add_argument("--world", type=Path, default=None)
    p.add_argument("--scale", default="demo")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-units", type=int, default=4096)
    p.add_argument("--bucket-window", type=int, default=4096)
    args = p.parse_args(argv)
    if args.real_shapes:
        import tempfile

        from bench_sources import write_bench_sources
        with tempfile.TemporaryDirectory() as tmp:
            world = args.world or Path(tmp)
            if args.world is None:   # narrow features: the shapes are what is measured
                write_bench_sources(world, images=args.images, feature_dim=8, num_classes=5)
            print(f"# real-shape shards {world}; batch_units=10240 bucket_window=10240")
            fixed_shape_figures(world, args.batches, args.buckets, args.built)
        return 0
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
