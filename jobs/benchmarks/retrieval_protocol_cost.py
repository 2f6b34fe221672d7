"""What a retrieval finetuning step costs under each family's protocol.

    python jobs/benchmarks/retrieval_protocol_cost.py --world runs/worlds/tiny \
        [--family soho-tiny] [--batch 16] [--steps 5] [--losses margin,binary,in-batch-binary]

UNITER's margin and ImageBERT's binary loss score 1 + 2k rows per caption (k sampled negatives
per side); SOHO's in-batch binary loss (§4.2.1) scores every image of the mini-batch against
every caption of it, t² rows for t captions. This times training steps (forward, backward,
AdamW) of the finetune's own model and batches, in this process (no Ray), after one warm-up
step each. The losses take turns, one step each per round (A B C A B C …), so a machine whose
load drifts slows them alike; a loss's figure is its median step, in the process's CPU
seconds (on a shared machine wall time mostly measures the other users). Prints one figure
per line: ``retrieval_protocol.<loss>.rows_per_step``, ``….cpu_s_per_step``, and
``….cpu_s_per_step_vs_margin`` (the ratio, measured in the same run).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def build(world: str, family: str, loss: str, batch: int, steps: int):
    """(one training step as a function, the step's batches, rows per step)."""
    from vlp.contract import batch_spec as K
    from vlp.platform.finetune.finetune_config import load_finetune_config
    from vlp.platform.finetune.preflight import prepare
    from vlp.platform.finetune.run import components_for
    from vlp.platform.training.protocols import WorkerInfo

    cfg = load_finetune_config(data={
        "world": world, "benchmarks": ["retrieval"], "mlflow": {"enabled": False},
        "model": {"family": family, "init": "random"},
        "settings": {"retrieval": {"options": {"loss": loss}}}}).resolved_paths()
    _, _, lr, options = cfg.settings_for("retrieval")
    comp = components_for(cfg, "retrieval", prepare(cfg), batch, options)
    torch.manual_seed(0)
    model = comp.build_model(None, []).train()
    src = comp.build_batch_source(None, None, 0, WorkerInfo(0, 1, 0, torch.device("cpu"), 0))
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    batches = [src.next("retrieval") for _ in range(steps + 1)]

    def step(b) -> float:
        t0 = time.process_time()
        out = model(b, task="retrieval")
        opt.zero_grad()
        out["loss"].backward()
        opt.step()
        return time.process_time() - t0

    return step, batches, int(batches[0][K.INPUT_IDS].shape[0])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--world", required=True, help="a vlp world folder (vlp data synth)")
    p.add_argument("--family", default="soho-tiny")
    p.add_argument("--batch", type=int, default=16, help="captions per step (SOHO's t: 24)")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--losses", default="margin,binary,in-batch-binary")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    losses = args.losses.split(",")
    built = {loss: build(args.world, args.family, loss, args.batch, args.steps)
             for loss in losses}
    for step, batches, _ in built.values():
        step(batches[0])                                   # warm-up: allocator, first shapes
    times: dict[str, list[float]] = {loss: [] for loss in losses}
    for r in range(1, args.steps + 1):
        for loss, (step, batches, _) in built.items():
            times[loss].append(step(batches[r]))
    seconds = {loss: statistics.median(t) for loss, t in times.items()}
    for loss in losses:
        print(f"retrieval_protocol.{loss}.rows_per_step {built[loss][2]}")
        print(f"retrieval_protocol.{loss}.cpu_s_per_step {seconds[loss]:.3f}")
    if "margin" in seconds:
        for loss in losses:
            if loss != "margin":
                print(f"retrieval_protocol.{loss}.cpu_s_per_step_vs_margin "
                      f"{seconds[loss] / seconds['margin']:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
