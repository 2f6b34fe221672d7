"""What a training run prints before its first step (rank 0, ``[vlp pretrain] …``): the
model, the steps and stages, the objective, the global batch, precision and the MFU peak;
and the figures among them that go to MLflow once, on a fresh run."""

from __future__ import annotations

from typing import Any, Callable

from vlp.platform.training import objective
from vlp.platform.training.device_peaks import device_name
from vlp.platform.training.loop_config import LoopConfig


def engine_lines(c: LoopConfig, *, world: int, device: Any, n_params: int) -> list[str]:
    """The ZeRO stage and the gradients' dtypes, and the network a multi-node GPU run
    crosses."""
    from vlp.platform.cluster.interconnect import interconnect_line
    from vlp.platform.training.engine import deepspeed_config, gradient_line, overlaps_exchange

    ds = deepspeed_config(c, world, device=device, num_parameters=n_params)
    lines = [gradient_line(ds, overlap=overlaps_exchange(ds, c, world),
                           wire=c.train.grad_wire_dtype)]
    network = interconnect_line(c.scaling.use_gpu, world)
    return lines + ([network] if network else [])


def run_banner(c: LoopConfig, *, world: int, n_params: int, n_trainable: int, total: int,
               task_names: list[str], precision: str, device: Any, peak: float
               ) -> tuple[list[str], dict[str, int]]:
    """The lines, and the derived figures for the tracker."""
    plan = c.stages
    micro = c.train.grad_accum * world
    budget = c.batch_input_units * micro
    stages = ", ".join(f"{s.name}: {s.steps}" for s in plan)
    lines = [
        f"model {c.family}: {n_params:,} parameters ({n_trainable:,} "
        f"trainable); tasks {', '.join(task_names)}",
        f"steps: {total:,} in {len(plan)} stage(s) ({stages}); {c.train.grad_accum} "
        f"micro-batch(es) × {world} worker(s) = {micro} per step",
    ]
    if c.job == "pretrain":
        lines.append(objective.describe(c.train.objective, [dict(s.tasks) for s in plan]))
        groups = objective.describe_groups(c.train.objective, c.train.forward_groups,
                                           [dict(s.tasks) for s in plan])
        if groups:
            lines.append(groups)
    if budget:   # budget batching (pretraining); finetunes count examples per batch
        lines.append(f"global batch: ≤ {budget:,} input units per step "
                     f"({c.batch_input_units:,} per micro-batch); examples per step are "
                     f"measured at step 1 (budget batching)")
    from vlp.platform.training.engine import precision_line

    name = device_name(device) or device.type
    ahead = (f"prefetch {c.train.prefetch_batches} micro-batch(es) ahead, built "
             + (_processes(c.train.batch_builders) if c.train.batch_builder == "process"
                else "on a thread")
             if c.train.prefetch_batches else "no prefetch")
    lines.append(f"{precision_line(c, precision, device)}; {ahead}; MFU " + (
                     f"against {peak / 1e12:.1f} TFLOP/s per device ({name})"
                     if peak else f"unknown: no peak FLOP/s known for {name} "
                     "(set train.peak_tflops)"))
    lines += engine_lines(c, world=world, device=device, n_params=n_params)
    figures = {"parameters": n_params, "trainable_parameters": n_trainable,
               "total_steps": total, "micro_batches_per_step": micro}
    if budget:
        figures["global_batch_input_units_budget"] = budget
    return lines, figures


def _processes(count) -> str:
    if count == "auto":
        return "in processes of their own (auto: one, and more while the loop waits on data)"
    return "in a process of their own" if count == 1 else f"in {count} processes of their own"


def announce(c: LoopConfig, tracker: Any, say: Callable[[str], None], fresh: bool,
             **figures: Any) -> None:
    """The banner printed; on a fresh run its derived figures logged once (``figures``:
    ``run_banner``'s keywords)."""
    lines, derived = run_banner(c, **figures)
    for line in lines:
        say(line)
    if fresh:
        tracker.log_derived(derived)


def announce_measured(record: dict[str, Any], tracker: Any, say: Callable[[str], None]
                      ) -> None:
    """Step 1's measured global batch, printed and logged (the banner's is planned)."""
    say(f"step 1: global batch = {record['global_batch_examples']:,} examples, "
        f"{record['global_batch_input_units']:,} input units")
    tracker.log_derived({
        "global_batch_examples_step1": record["global_batch_examples"],
        "global_batch_input_units_step1": record["global_batch_input_units"]})
