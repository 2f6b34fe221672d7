"""When does pretraining start to read the image? The grounding probe along one pretraining run.

    python jobs/benchmarks/grounding_curve.py --world W [--tasks mlm=1,itm=1] [--steps 10000]
        [--every 1000] [--seed 0] [--dropout 0]

Pretrains uniter-tiny with the calibration's local loop (``vlp.testing.calibration``: the
platform's optimiser recipe over the pipeline's local iterator, batches of ``--units`` input
units) and, every ``--every`` steps, runs ``vlp.testing.grounding``'s probe on the model in
memory:
masked class and colour words of val captions, predicted with the caption's own image and
with another image. The two equal means the text predictions ignore the image.

Prints one figure per line: ``grounding_curve.<step>.<class|colour>.<true|shuffled> value``,
the chance levels once, and the first probed step where class words with the own image beat
another image by ``--margin`` points (``grounding_curve.first_grounded_step``; steps + 1 when
never).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from vlp.testing.calibration import local_pretrain
from vlp.testing.grounding import probe


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--world", required=True, help="a vlp world folder (demo scale or larger)")
    p.add_argument("--tasks", default="mlm=1,itm=1", help="pretraining mix, task=ratio,...")
    p.add_argument("--steps", type=int, default=10000)
    p.add_argument("--every", type=int, default=1000, help="probe every this many steps")
    p.add_argument("--units", type=int, default=4096, help="input units per batch")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dropout", type=float, default=0.0)
    p.add_argument("--margin", type=float, default=5.0,
                   help="points by which own-image class accuracy must beat another image's")
    args = p.parse_args()
    try:
        tasks = {k: float(v) for k, v in (kv.split("=") for kv in args.tasks.split(","))}
    except ValueError:
        p.error(f"--tasks: expected task=ratio,..., got {args.tasks!r}")
    first = [args.steps + 1]

    def on_every(step, model, spec):
        scores = probe(model, spec, args.world)
        if step == args.every:
            for kind in ("class", "colour"):
                print(f"grounding_curve.chance.{kind} {scores[f'{kind}.chance']:.2f}", flush=True)
        for kind in ("class", "colour"):
            for mode in ("true", "shuffled"):
                print(f"grounding_curve.{step}.{kind}.{mode} {scores[f'{kind}.{mode}']:.2f}",
                      flush=True)
        if scores["class.true"] - scores["class.shuffled"] >= args.margin and first[0] > step:
            first[0] = step

    with tempfile.TemporaryDirectory() as tmp:
        local_pretrain(args.world, str(Path(tmp) / "model.pt"), family="uniter-tiny",
                       tasks=tasks, steps=args.steps, lr=args.lr, batch_units=args.units,
                       seed=args.seed, dropout=args.dropout, every=args.every,
                       on_every=on_every, say=lambda s: print(s, file=sys.stderr, flush=True))
    print(f"grounding_curve.first_grounded_step {first[0]}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
