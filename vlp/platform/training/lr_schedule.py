"""The learning-rate schedule every vlp training loop uses (a LambdaLR multiplier): its own
module so that the engine and the SOHO optimizer recipe both build on it."""

from __future__ import annotations


class WarmupLinearDecay:
    """LambdaLR multiplier for the k-th optimizer step (k = index + 1): k / warmup during
    warm-up, then linear from 1 down to 1 / (total - warmup) at the last step (UNITER's
    ``warmup_linear``, shifted so that the first and last steps do not get lr 0). A class,
    not a closure, so that LambdaLR's state_dict (saved in checkpoints) can hold it."""

    def __init__(self, warmup_steps: int, total_steps: int, decay: bool = True):
        self.warmup_steps = warmup_steps
        self.total_steps = total_steps
        self.decay = decay

    def __call__(self, index: int) -> float:
        k = index + 1
        if k <= self.warmup_steps:
            return k / self.warmup_steps
        if not self.decay:
            return 1.0
        return max(0.0, (self.total_steps - k + 1) / max(1, self.total_steps - self.warmup_steps))
