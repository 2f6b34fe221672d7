"""The gradient exchange's exposed (non-overlapped) time per step, before and after
``train.grad_overlap``, on gloo ranks on this CPU; and the wire dtype's effect on training.

Part 1, for each world size: one bf16/ZeRO-1 DeepSpeed engine per rank (``build_engine``,
a small encoder: 4 transformer layers, width 256), steps timed in three modes interleaved
round by round, so that the machine's load falls on all three alike:
  none     no gradient exchange at all (the compute; a wrong step, for the baseline)
  after    DeepSpeed's reduction after the backward (train.grad_overlap: false)
  overlap  buckets all-reduced during the backward (train.grad_overlap: true)
  overlap_bf16  the same with the bf16 wire (train.grad_wire_dtype: bf16): half the bytes
Exposed time = median step of the mode − median step of ``none``; the ratios overlap ÷ after
and bf16 wire ÷ fp32 wire are from the same run.

Part 2: a tiny model trained 200 steps on 4 ranks with the fp32 and the bf16 wire (the same
seed and batches), and the loss difference; beside it the difference between the overlapped
fp32 exchange and DeepSpeed's (rounding only), for scale.

    python jobs/benchmarks/grad_exchange_overlap.py [--worlds 2 4] [--steps 12]
        [--wire-steps 200]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn


class Encoder(nn.Module):
    def __init__(self, width: int = 256, layers: int = 4, vocab: int = 1000):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.layers = nn.ModuleList(nn.TransformerEncoderLayer(
            width, 4, 4 * width, dropout=0.0, batch_first=True) for _ in range(layers))
        self.head = nn.Linear(width, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)
        for layer in self.layers:
            h = layer(h)
        return nn.functional.cross_entropy(self.head(h).float().flatten(0, 1),
                                           ids.roll(1, 1).flatten())


def _config(overlap: bool, wire: str, steps: int, grad_accum: int = 1, bucket: int = 0):
    from vlp.platform.pretrain.experiment_config import load_experiment_config
    from vlp.platform.pretrain.run import loop_config

    return loop_config(load_experiment_config(data={
        "data": {"sources": {"a": {"path": "/x"}}}, "tasks": {"mlm": 1},
        "train": {"steps": steps, "precision": "bf16", "zero_stage": 1,
                  "grad_accum": grad_accum, "grad_overlap": overlap,
                  "grad_wire_dtype": wire, "grad_bucket_elements": bucket},
        "optimizer": {"warmup_steps": 1, "lr": 1e-3}}))


def _init(rank: int, world: int, port: int) -> None:
    from vlp.platform.training.rendezvous import join_group

    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)
    join_group("gloo", "127.0.0.1", port, rank, world)


def _timing_rank(rank: int, world: int, port: int, steps: int, queue) -> None:
    _init(rank, world, port)
    from vlp.platform.training.engine import build_engine

    torch.manual_seed(0)
    model = Encoder()
    engine = build_engine(model, _config(True, "fp32", 10**6), stage_steps=10**6,
                          world_size=world)
    ex = engine.optimizer._vlp_exchange
    gen = torch.Generator().manual_seed(rank)
    batch = torch.randint(0, 1000, (4, 64), generator=gen)
    fp32, bf16 = torch.float32, torch.bfloat16
    modes = {"none": (False, False, fp32), "after": (True, False, fp32),
             "overlap": (False, True, fp32), "overlap_bf16": (False, True, bf16)}
    times: dict[str, list[float]] = {m: [] for m in modes}
    for round_ in range(steps + 1):
        for mode, (after, overlap, wire) in modes.items():
            engine.enable_backward_allreduce, ex.active, ex.wire = after, overlap, wire
            dist.barrier()
            t0 = time.perf_counter()
            loss = engine(batch)
            engine.backward(loss)
            engine.step()
            dt = time.perf_counter() - t0
            if round_:                      # the first round warms up
                times[mode].append(dt)
    n = sum(p.numel() for p in model.parameters())
    if rank == 0:
        queue.put((n, len(ex.buckets), {m: statistics.median(t) for m, t in times.items()}))
    dist.barrier()
    dist.destroy_process_group()


def _wire_rank(rank: int, world: int, port: int, steps: int, queue) -> None:
    _init(rank, world, port)
    from vlp.platform.training.engine import build_engine

    curves = {}
    for name, overlap, wire in (("deepspeed", False, "fp32"), ("fp32", True, "fp32"),
                                ("bf16", True, "bf16")):
        torch.manual_seed(0)
        model = Encoder(width=32, layers=2, vocab=64)
        engine = build_engine(model, _config(overlap, wire, steps, bucket=2048),
                              stage_steps=steps, world_size=world)
        gen = torch.Generator().manual_seed(100 + rank)
        losses = []
        for _ in range(steps):
            ids = torch.randint(0, 64, (8, 16), generator=gen)
            loss = engine(ids)
            engine.backward(loss)
            engine.step()
            t = loss.detach().float()
            dist.all_reduce(t)
            losses.append(float(t) / world)
        curves[name] = losses
        engine.destroy()
    if rank == 0:
        queue.put(curves)
    dist.barrier()
    dist.destroy_process_group()


def _spawn(fn, world: int, steps: int):
    from vlp.platform.training.rendezvous import open_store

    store = open_store()            # the ranks' rendezvous, held until they are done
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=fn, args=(r, world, store.port, steps, queue))
             for r in range(world)]
    for p in procs:
        p.start()
    result = queue.get(timeout=1800)
    for p in procs:
        p.join()
    return result


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--worlds", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--wire-steps", type=int, default=200)
    ap.add_argument("--wire-world", type=int, default=4)
    args = ap.parse_args()
    print(f"load average: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    for world in args.worlds:
        n, buckets, med = _spawn(_timing_rank, world, args.steps)
        print(f"world {world}: {n:,} parameters, {buckets} buckets, median step of "
              f"{args.steps}")
        for mode, t in med.items():
            print(f"world {world}: step {mode}: {t * 1e3:.1f} ms")
        after, overlap = med["after"] - med["none"], med["overlap"] - med["none"]
        print(f"world {world}: exposed exchange after the backward: {after * 1e3:.1f} ms")
        print(f"world {world}: exposed exchange overlapped: {overlap * 1e3:.1f} ms")
        print(f"world {world}: exposed ratio overlapped / after: "
              f"{overlap / after if after > 0 else float('nan'):.2f}")
        bf16 = med["overlap_bf16"] - med["none"]
        print(f"world {world}: exposed exchange overlapped, bf16 wire: {bf16 * 1e3:.1f} ms")
        print(f"world {world}: exposed ratio bf16 wire / fp32 wire: "
              f"{bf16 / overlap if overlap > 0 else float('nan'):.2f}")
    if args.wire_steps:
        world = args.wire_world
        curves = _spawn(_wire_rank, world, args.wire_steps)
        ref = curves["deepspeed"]
        for name in ("fp32", "bf16"):
            diffs = [abs(a - b) for a, b in zip(curves[name], ref)]
            print(f"wire {name} vs DeepSpeed's fp32 reduction, {world} ranks, "
                  f"{args.wire_steps} steps: max |loss diff| {max(diffs):.2e}, mean "
                  f"{statistics.mean(diffs):.2e}, last 20 mean "
                  f"{statistics.mean(diffs[-20:]):.2e}")
        for name, c in curves.items():
            print(f"wire {name}: loss first {c[0]:.4f} last-20 mean "
                  f"{statistics.mean(c[-20:]):.4f}")


if __name__ == "__main__":
    main()
