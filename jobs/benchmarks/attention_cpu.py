"""CPU training attention alone: transformers' eager attention against ``vlp_eager``
(``vlp/models/attention.py``), forward+backward with dropout, alternated in one run.

    python jobs/benchmarks/attention_cpu.py --threads 2

The core only (scores, softmax, dropout, context; no projections), on q, k, v laid out as
the Linear projections give them ([B, L, heads·d] viewed per head). Prints the process CPU
time and wall time per call (min and median over the rounds) and their ratios: on a shared
machine CPU time and the minimum are the steadier figures.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
from torch import nn
from transformers.models.bert.modeling_bert import eager_attention_forward

from vlp.models.attention import vlp_eager_attention


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--length", type=int, default=56, help="20 tokens + 36 regions")
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--head-size", type=int, default=64)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--calls", type=int, default=3, help="calls per round and implementation")
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    b, n, h, d = args.batch, args.length, args.heads, args.head_size
    module = nn.Module().train()
    projections = [torch.randn(b, n, h * d, requires_grad=True) for _ in range(3)]
    ways = {"eager": eager_attention_forward, "vlp_eager": vlp_eager_attention}

    def call(fn):
        q, k, v = (x.view(b, n, h, d).transpose(1, 2) for x in projections)
        out, _ = fn(module, q, k, v, None, scaling=d ** -0.5, dropout=0.1)
        out.sum().backward()

    for fn in ways.values():
        call(fn)                       # first-call costs
    times = {name: [] for name in ways}
    for _ in range(args.rounds):
        for name, fn in ways.items():
            c0, t0 = time.process_time(), time.perf_counter()
            for _ in range(args.calls):
                call(fn)
            times[name].append(((time.process_time() - c0) / args.calls,
                                (time.perf_counter() - t0) / args.calls))
    print(f"# attention_cpu: B={b} L={n} heads={h} d={d}, dropout 0.1, fwd+bwd; "
          f"{args.rounds} rounds × {args.calls} calls, alternated; torch threads "
          f"{torch.get_num_threads()}")
    summary = {}
    for name, rows in times.items():
        for i, kind in enumerate(("cpu", "wall")):
            values = [r[i] for r in rows]
            summary[name, kind] = (min(values), statistics.median(values))
            print(f"{name}/{kind}_ms_min {min(values) * 1e3:.1f}")
            print(f"{name}/{kind}_ms_median {statistics.median(values) * 1e3:.1f}")
    for kind in ("cpu", "wall"):
        for j, stat in enumerate(("min", "median")):
            ratio = summary["vlp_eager", kind][j] / summary["eager", kind][j]
            print(f"vlp_over_eager/{kind}_{stat} {ratio:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
