"""Can a model family learn image-text matching when the answer sits plainly in the features?

    python jobs/benchmarks/itm_toy.py [--family uniter-tiny] [--steps 3000] [--seed 0]

A diagnostic for "pretraining learns no grounding" (issue 6): it separates the data from the
optimisation. Each toy example is [CLS] <class word> [SEP] and an image of ``--regions``
regions whose features are a fixed random projection of one-hot (class, colour) plus noise
(a linear probe reads the class perfectly). Positives contain the named class; negatives are
images without it. Nothing but matching separates them: a model that learns ITM here reaches
~1.0, one that does not stays at 0.5.

Each variant trains the family's ITM head with the platform's optimiser recipe (AdamW 0.9 /
0.98, lr ``--lr``) on the same stream. Variants change only initialisation scale and
dropout (``transformer.*`` overrides of the family), the two knobs the toy showed matter.

Prints one figure per line: ``itm_toy.<variant>.steps_to_0.6`` (the first step at which the
mean accuracy over the last 100 steps reaches 0.6; ``--steps`` + 1 when never) and
``itm_toy.<variant>.final_acc``.
"""

from __future__ import annotations

import argparse
import sys
import time


import numpy as np
import torch

from vlp.contract import batch_spec as K

CLS, SEP, FIRST_CLASS_WORD = 101, 102, 3000
# BERT-base's std 0.02 at width 768 gives a projection std·sqrt(width) ≈ 0.55; a 64-wide
# model keeps that scale with std 0.069 (×3.46)
VARIANTS = {
    "bert-init": {"transformer.initializer_range": 0.02},
    "bert-init-no-dropout": {"transformer.initializer_range": 0.02,
                             "transformer.hidden_dropout": 0.0,
                             "transformer.attention_dropout": 0.0},
    "width-scaled-init": {"transformer.initializer_range": "width"},
    "width-scaled-init-no-dropout": {"transformer.initializer_range": "width",
                                     "transformer.hidden_dropout": 0.0,
                                     "transformer.attention_dropout": 0.0},
}


class ToyStream:
    def __init__(self, batch: int, regions: int, feat_dim: int, classes: int, seed: int):
        self.g = np.random.default_rng(seed)
        self.b, self.n, self.d, self.c = batch, regions, feat_dim, classes
        self.proj = self.g.normal(0, 1, (2 * classes, feat_dim))

    def next(self) -> dict[str, torch.Tensor]:
        g, b, n, c = self.g, self.b, self.n, self.c
        word = g.integers(0, c, b)
        label = (g.random(b) < 0.5).astype(np.int64)
        cls = g.integers(0, c, (b, n))
        cls[:, 0] = word                                     # positives: the class is there
        neg = label == 0                                     # negatives: a class that is not
        shift = g.integers(1, c, (int(neg.sum()), n))
        cls[neg] = (word[neg, None] + shift) % c
        cls = np.take_along_axis(cls, g.permutation(n)[None].repeat(b, 0), 1)
        onehot = np.zeros((b, n, 2 * c))
        np.put_along_axis(onehot, cls[..., None], 1.0, 2)
        np.put_along_axis(onehot, c + g.integers(0, c, (b, n, 1)), 1.0, 2)
        feats = np.maximum(onehot @ self.proj + 0.3 * g.normal(size=(b, n, self.d)), 0.0)
        ids = np.stack([np.full(b, CLS), FIRST_CLASS_WORD + word, np.full(b, SEP)], 1)
        return {K.INPUT_IDS: torch.tensor(ids), K.TEXT_MASK: torch.ones(b, 3, dtype=torch.long),
                K.REGION_FEATS: torch.tensor(feats, dtype=torch.float32),
                K.REGION_LOC: torch.zeros(b, n, 7),
                K.REGION_MASK: torch.ones(b, n, dtype=torch.long),
                K.ITM_LABELS: torch.tensor(label), K.POSITIVE: torch.tensor(label == 1),
                K.NUM_EXAMPLES: torch.tensor(b), K.INPUT_UNITS: torch.tensor(b * (3 + n))}


def run_variant(family: str, overrides: dict, args) -> tuple[int, float, float]:
    from vlp.models import create_model
    from vlp.models.families import get_family
    overrides = dict(overrides)
    if overrides.get("transformer.initializer_range") == "width":
        t = get_family(family).transformer
        overrides["transformer.initializer_range"] = 0.02 * (768 / t.hidden_size) ** 0.5
    torch.manual_seed(args.seed)
    model = create_model(family, ["itm"], region_feat_dim=args.feat_dim, num_classes=2,
                         overrides=overrides).model
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.98), eps=1e-6,
                            weight_decay=0.01)
    stream = ToyStream(args.batch, args.regions, args.feat_dim, args.classes, args.seed)
    accs, reached, start = [], args.steps + 1, time.perf_counter()
    for step in range(1, args.steps + 1):
        out = model(stream.next(), task="itm")
        opt.zero_grad()
        out["loss"].backward()
        opt.step()
        accs.append(float(out["itm_acc"]))
        if reached > args.steps and step >= 100 and np.mean(accs[-100:]) >= 0.6:
            reached = step
    return reached, float(np.mean(accs[-100:])), time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--family", default="uniter-tiny")
    p.add_argument("--variants", default=",".join(VARIANTS),
                   help=f"comma-separated, from: {', '.join(VARIANTS)}")
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--regions", type=int, default=6)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--feat-dim", type=int, default=256)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    unknown = [v for v in args.variants.split(",") if v not in VARIANTS]
    if unknown:
        p.error(f"unknown variant(s) {unknown}; choose from {list(VARIANTS)}")
    torch.set_num_threads(args.threads)
    print(f"# {args.family}: ITM on [CLS] class [SEP] vs {args.regions} regions, "
          f"batch {args.batch}, lr {args.lr}, {args.steps} steps", flush=True)
    for name in args.variants.split(","):
        reached, final, seconds = run_variant(args.family, VARIANTS[name], args)
        print(f"itm_toy.{name}.steps_to_0.6 {reached}", flush=True)
        print(f"itm_toy.{name}.final_acc {final:.3f}", flush=True)
        print(f"itm_toy.{name}.seconds {seconds:.0f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
