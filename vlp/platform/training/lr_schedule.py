"""The learning-rate schedule every vlp training loop uses (a LambdaLR multiplier): its own
module so that the engine and the SOHO optimizer recipe both build on it."""

from __future__ import annotations

from typing import Any


class WarmupLinearDecay:
    """LambdaLR multiplier for the k-th optimizer step (k = index + 1): k / warmup during
    warm-up, then linear from 1 down to 1 / (total - warmup) at the last step (UNITER's
    ``warmup_linear``, shifted so that the first and last steps do not get lr 0), or flat
    (``decay`` False). ``milestones`` (optimizer steps, increasing): the multiplier is also
    scaled by ``factor`` once per milestone reached — from the step whose index equals the
    milestone on, as torch's MultiStepLR (SOHO §4.1: ×0.1 at epochs 25 and 35 of 40). A class,
    not a closure, so that LambdaLR's state_dict (saved in checkpoints) can hold it; flat
    fields only."""

    def __init__(self, warmup_steps: int, total_steps: int, decay: bool = True,
                 milestones: tuple[int, ...] = (), factor: float = 0.1):
        self.warmup_steps = warmup_steps
        self.total_steps = total_steps
        self.decay = decay
        self.milestones = tuple(int(m) for m in milestones)
        self.factor = float(factor)

    def __call__(self, index: int) -> float:
        k = index + 1
        step = self.factor ** sum(index >= m for m in getattr(self, "milestones", ()))
        if k <= self.warmup_steps:
            return step * k / self.warmup_steps
        if not self.decay:
            return step
        return step * max(0.0, (self.total_steps - k + 1)
                          / max(1, self.total_steps - self.warmup_steps))


def schedule_for(optimizer: Any, stage_steps: int) -> WarmupLinearDecay:
    """A stage's schedule from an optimizer section (``schedule``: linear | constant | step,
    ``warmup_steps``, ``milestones``, ``decay_factor``)."""
    kind = optimizer.schedule
    return WarmupLinearDecay(optimizer.warmup_steps, stage_steps, decay=kind == "linear",
                             milestones=tuple(optimizer.milestones) if kind == "step" else (),
                             factor=optimizer.decay_factor)


def device_multiplier(schedule: WarmupLinearDecay, index: Any) -> Any:
    """``schedule(index)`` for a 0-d float tensor ``index`` on the device, as tensor
    operations (no value read back, so that it may be captured in a CUDA graph); equal to the
    float one (tests/test_lr_schedule_device.py)."""
    import torch

    k = index + 1
    step = torch.ones_like(index)
    for m in getattr(schedule, "milestones", ()):
        step = torch.where(index >= m, step * schedule.factor, step)
    warm = k / schedule.warmup_steps if schedule.warmup_steps > 0 else torch.ones_like(k)
    if schedule.decay:
        after = ((schedule.total_steps - k + 1)
                 / max(1, schedule.total_steps - schedule.warmup_steps)).clamp(min=0.0)
    else:
        after = torch.ones_like(k)
    return step * torch.where(k <= schedule.warmup_steps, warm, after)
