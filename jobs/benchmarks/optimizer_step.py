"""One AdamW step over a model family's parameters: torch's per-parameter loop, its foreach and
its fused implementation, alternated in one run (what ``optimizer.impl`` chooses between).

    python jobs/benchmarks/optimizer_step.py --family uniter-base --threads 2

The parameters and parameter groups (no decay on biases and norm weights) are the family's,
as the engine gets them; gradients are random. After ``--rounds`` rounds (each runs every
implementation once, the order rotating), prints one figure per line: ``<impl>/step_ms``
(median) and ``fused_speedup_over_loop``, then the largest difference between the loop's and
the fused implementation's weights after three identical steps (fp32 rounding only).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

from vlp.models import create_model
from vlp.platform.training.engine import param_groups

IMPLS = {"loop": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}


def optimizer(model: torch.nn.Module, impl: str, seed: int) -> torch.optim.Optimizer:
    g = torch.Generator().manual_seed(seed)
    for p in model.parameters():
        p.grad = torch.randn(p.shape, generator=g)
    return torch.optim.AdamW(param_groups(model, 0.01), lr=1e-4, **IMPLS[impl])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--family", default="uniter-base")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    models, opts = {}, {}
    for i, impl in enumerate(IMPLS):
        torch.manual_seed(0)
        models[impl] = create_model(args.family, tasks=["mlm", "itm"])[0].to(device)
        opts[impl] = optimizer(models[impl], impl, seed=1)
        opts[impl].step()                                 # state allocated, kernels warm
    n = sum(q.numel() for q in models["loop"].parameters())
    print(f"# optimizer_step: {args.family}, {n / 1e6:.1f}M parameters, AdamW, device "
          f"{device.type}, torch {torch.__version__}, {torch.get_num_threads()} threads"
          + (f", load average {os.getloadavg()[0]:.1f}" if device.type == "cpu" else ""))
    times = {impl: [] for impl in IMPLS}
    names = list(IMPLS)
    for r in range(args.rounds):
        for impl in names[r % 3:] + names[:r % 3]:
            if device.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            opts[impl].step()
            if device.type == "cuda":
                torch.cuda.synchronize()
            times[impl].append(time.perf_counter() - t0)
    step = {impl: statistics.median(v) for impl, v in times.items()}
    for impl in IMPLS:
        print(f"{impl}/step_ms {1e3 * step[impl]:.1f}")
    print(f"fused_speedup_over_loop {step['loop'] / step['fused']:.2f}")

    same = {}
    for impl in ("loop", "fused"):
        torch.manual_seed(0)
        model = create_model(args.family, tasks=["mlm", "itm"])[0].to(device)
        opt = optimizer(model, impl, seed=1)
        for _ in range(3):
            opt.step()
        same[impl] = [q.detach() for q in model.parameters()]
    diff = max((a - b).abs().max().item() for a, b in zip(same["loop"], same["fused"]))
    print(f"max_weight_difference_loop_vs_fused {diff:.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
