"""A step's record from its all-reduced statistics, at once or read a few steps late.

The loop (``loop.py``) makes a record per optimizer step (step, stage, tasks, lr, times);
here it gains the global batch, the model FLOPs (padded and on real units) and the loss
means. Where the optimizer skips a non-finite update on the device (``device_step.py``),
the statistics arrive ``loop.STATS_LAG`` steps late with the gradient norm and the
skip flag appended: ``read_late`` turns them back into records."""

from __future__ import annotations

from typing import Any, Iterator

from vlp.models.flops import EncoderShape
from vlp.platform.training.pending_stats import PendingStats
from vlp.platform.training.step_stats import read_step


def complete_record(record: dict[str, Any], stats: dict[str, Any], passes: float,
                    grad_accum: int, shape: EncoderShape | None) -> dict[str, Any]:
    """``record`` with its step's statistics (all-reduced over the ranks)."""
    record.update(global_batch_examples=stats["examples"],
                  global_batch_input_units=stats["input_units"],
                  global_batch_real_units=stats["real_units"])
    if shape is not None:
        # summed objective: every task's forward of the set (this rank's ratio)
        record["model_flops"] = passes / grad_accum * shape.train_flops(
            stats["examples"], stats["input_units"])
        # the same on the unpadded tokens (the real units summed over the passes)
        record["model_flops_real"] = shape.train_flops(
            stats["examples"] * passes / grad_accum, stats["real_units"])
    record.update(stats["means"])
    record["loss"] = stats["loss_sum"] / grad_accum
    return record


def read_late(pending: PendingStats, *, world: int, rank: int, read_at: int, drain: bool
              ) -> Iterator[tuple[dict[str, Any], dict[str, Any], float, bool]]:
    """Per step whose statistics have come (all of them: ``drain``): its record (with
    ``grad_norm``), its statistics, its forward passes and whether the device skipped its
    update. ``read_at``: the loop's step now, named in a non-finite loss's error."""
    for values, (record, micro, keys, passes) in (
            pending.drain() if drain else pending.ready()):
        step = record["step"]
        try:
            stats = read_step(values[:-2], micro, keys, world, rank, step - 1)
        except FloatingPointError as e:
            raise FloatingPointError(f"{e} (its update was skipped on the device; read "
                                     f"at step {read_at})") from None
        grad_norm, skipped = values[-2:]
        record["grad_norm"] = grad_norm
        yield record, stats, passes, bool(skipped)
