"""The encoder's query, key and value projections as one product against three
(``vlp/models/fused_qkv.py`` against ``transformers``' ``BertSelfAttention``): the same model
and batches, forward + backward, the two taking turns.

    python jobs/benchmarks/fused_qkv.py                          # uniter-base, standard batch
    python jobs/benchmarks/fused_qkv.py --family uniter-tiny --rounds 3

Standard batch: 32 pairs × 20 text tokens × 36 regions (1792 input units), every row full;
the task mix's tasks in turn (mlm, itm, mrfr, mrc-kl), one step each per pass. fp32 on CPU,
bf16 weights on CUDA. Each round times one pass of the fused encoder, then one of the
separate projections (after one unmeasured pass of each); the ratio is of the sums over the
rounds. The aten operations each dispatches per step (forward with the loss, backward) are
counted on one more pass: the host's share of a step that the host bounds (on a GPU).

Prints a settings block, then one figure per line.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time

import torch

from vlp.platform.gpu_check.anatomy import OpCounter
from vlp.models import create_model
from vlp.models.fused_qkv import FusedQKVSelfAttention, fuse_qkv, separate_qkv
from vlp.testing.example_batches import example_batch

TASKS = ("mlm", "itm", "mrfr", "mrc-kl")


def timed_pass(model, batches: dict, device: torch.device) -> tuple[float, float]:
    """(seconds, process CPU seconds) of one forward+backward per task."""
    if device.type == "cuda":
        torch.cuda.synchronize()
    t0, c0 = time.perf_counter(), time.process_time()
    for task in TASKS:
        _step(model, batches[task], task, contextlib.nullcontext(), contextlib.nullcontext())
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t0, time.process_time() - c0


def counted_pass(model, batches: dict) -> tuple[float, float]:
    """(forward, backward) aten operations per step over one forward+backward per task."""
    fwd, bwd = OpCounter(), OpCounter()
    for task in TASKS:
        _step(model, batches[task], task, fwd, bwd)
    return (sum(fwd.ops.values()) / len(TASKS), sum(bwd.ops.values()) / len(TASKS))


def _step(model, batch: dict, task: str, around_forward, around_backward) -> None:
    with around_forward:
        loss = model(batch, task=task)["loss"]
    with around_backward:
        loss.backward()
    model.zero_grad(set_to_none=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--family", default="uniter-base")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--text-len", type=int, default=20)
    p.add_argument("--regions", type=int, default=36)
    p.add_argument("--rounds", type=int, default=2, help="timed passes of each, in turns")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    args = p.parse_args(argv)

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model, spec, _ = create_model(args.family, tasks=list(TASKS))
    model.to(device, torch.bfloat16 if device.type == "cuda" else torch.float32).train()
    dtype = next(model.parameters()).dtype
    batches = {t: {k: (v.to(device, dtype) if v.is_floating_point() else v.to(device))
                   for k, v in example_batch(spec, t, batch_size=args.batch,
                                             text_len=args.text_len,
                                             num_regions=args.regions,
                                             full_length=True).items()} for t in TASKS}
    fuse_qkv(model)   # the default already
    layers = sum(isinstance(m, FusedQKVSelfAttention) for m in model.modules())
    print(f"# fused_qkv: {args.family}, {layers} self-attention layers; batch {args.batch} × "
          f"({args.text_len} tokens + {args.regions} regions); tasks {', '.join(TASKS)} in "
          f"turn; {device} {dtype}; torch threads {torch.get_num_threads()}; {args.rounds} "
          "rounds, fused then separate")

    def switch(fused: bool) -> None:
        (fuse_qkv if fused else separate_qkv)(model)

    wall = {True: 0.0, False: 0.0}
    cpu = {True: 0.0, False: 0.0}
    for fused in (True, False):   # shapes and allocator seen once by each
        switch(fused)
        timed_pass(model, batches, device)
    for _ in range(args.rounds):
        for fused in (True, False):
            switch(fused)
            seconds, cpu_seconds = timed_pass(model, batches, device)
            wall[fused] += seconds
            cpu[fused] += cpu_seconds
    steps = args.rounds * len(TASKS)
    ops = {}
    for fused in (True, False):
        switch(fused)
        ops[fused] = counted_pass(model, batches)
    switch(True)
    for fused, name in ((True, "fused"), (False, "separate")):
        print(f"{name}/step_ms {wall[fused] / steps * 1e3:.1f}")
        print(f"{name}/cpu_ms_per_step {cpu[fused] / steps * 1e3:.1f}")
        print(f"{name}/forward_ops_per_step {ops[fused][0]:.0f}")
        print(f"{name}/backward_ops_per_step {ops[fused][1]:.0f}")
    print(f"fused_over_separate_step_time {wall[True] / wall[False]:.3f}")
    print(f"fused_over_separate_ops {sum(ops[True]) / sum(ops[False]):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
