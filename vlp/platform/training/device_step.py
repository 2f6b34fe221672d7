"""The bf16 optimizer step without a host sync: clipping, the non-finite check and AdamW as
device-side operations.

DeepSpeed's ``BF16_Optimizer.step`` (bf16 under ZeRO-1, what a bf16 job gets) reads the
gradient norm into Python twice: ``is_invalid_grad_norm`` takes ``bool()`` of a comparison
to decide whether to skip the step, and ``clip_tensors_by_global_norm`` compares the clip
coefficient with 1 in Python. Each makes the host wait for the whole backward, so it can
never queue the next forward while the device works, and such a step cannot be captured in
a CUDA graph. ``use_device_step`` switches the optimizer (already given the flat
bookkeeping, ``bf16_bookkeeping.py``) to a subclass whose ``step`` does the same arithmetic
on the device:

- the norm as DeepSpeed takes it (each flat fp32 gradient buffer's 2-norm, squared, summed,
  square root: the same operations, so the same value);
- the clip as a coefficient ``min(1, clip / (norm + 1e-6))`` multiplied into the buffers
  (DeepSpeed multiplies only when it is below 1; a multiply by 1.0 is exact);
- the skip: ``found_inf`` = the norm is not finite, or the loop said a loss was not finite
  on some rank (``skip_if``), handed to torch's fused AdamW, whose kernel then leaves the
  weights and moments as they are and takes back the step count, as DeepSpeed's skip does;
- the learning rate as a device tensor (``param_groups`` keep their float ``lr``: the
  scheduler, ``get_lr`` and checkpoints see what they saw before); ``capturable`` set on
  CUDA, so that the update may be captured. Under vlp's schedule (a ``LambdaLR`` of
  ``WarmupLinearDecay``, ``attach_schedule``) the lr is computed on the device from the
  scheduler's step index, filled from the host before the update, less the skips the host
  has not read yet (a device count the skip flag adds to): a skipped update does not advance
  the schedule, as DeepSpeed's own skip holds it. Under any other schedule the host's float
  lr is filled in.

What of DeepSpeed the bf16 path still uses: the engine (``forward``/``backward``/``step``),
its ZeRO-1 partitioning of the fp32 master weights and Adam state, the fp32 gradient
buffers and their all-reduce after the last micro-batch, the bf16 ↔ fp32 copies and the
all-gather of the updated bf16 weights (``update_lp_params``), the gradient clearing, its
checkpoints and the lr scheduler's step. What it no longer uses: ``BF16_Optimizer.step``'s
norm, clip and overflow test.

The host learns of a skipped update only when it reads the step's statistics, a few steps
later (``pending_stats.PendingStats``), so DeepSpeed's engine steps the host's scheduler on
a skipped step; ``read_skip`` (the loop calls it then) steps it back and takes the skip off
the device's unread count, so the updates and the checkpointed scheduler see the schedule as
DeepSpeed's skip leaves it; only the lr logged for the steps in between is one step ahead.
The loop's step counter does count a skipped step (its statistics come late). Under bf16
a non-finite gradient is a fault, not an overflow to retry: the loop raises when the late
statistics show a non-finite loss, and reports a skip of a finite loss's non-finite norm.

Applies where the flat bookkeeping applies and the inner optimizer is torch's fused AdamW
(``optimizer.impl: auto`` or ``torch-fused``); elsewhere the optimizer is left alone.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import torch

from vlp.platform.training.bf16_bookkeeping import _flat_class, uses_flat_bookkeeping
from vlp.platform.training.lr_schedule import WarmupLinearDecay, device_multiplier

log = logging.getLogger(__name__)

CLIP_EPS = 1e-6     # DeepSpeed's clip_tensors_by_global_norm adds it to the norm


@functools.cache
def _device_class() -> type:

    class DeviceStepBF16Optimizer(_flat_class()):
        """The flat bookkeeping's optimizer, stepped without reading a value back."""

        def skip_if(self, flag: torch.Tensor) -> None:
            """A device flag (non-zero: skip this step's update), or'ed into the norm's."""
            self._vlp_skip_flag = flag

        def prepare_step(self) -> None:
            """The host's part, outside any capture: the scheduler's step index (or, under
            another schedule, the learning rates) into the device tensors the update reads."""
            sched = self._vlp_schedule
            if sched is not None:
                self._vlp_index.fill_(float(sched.last_epoch))
            for group, lr in zip(self.optimizer.param_groups, self._vlp_lr):
                if sched is None:
                    lr.fill_(float(group["lr"]))
                group["capturable"] = lr.device.type == "cuda"

        def read_skip(self, scheduler: Any) -> None:
            """The host has read that an update was skipped: the scheduler steps back (its
            step did not happen) and the device's unread skips lose one."""
            if self._vlp_schedule is None:
                return
            scheduler.last_epoch -= 1
            lrs = [base * fn(scheduler.last_epoch)
                   for fn, base in zip(scheduler.lr_lambdas, scheduler.base_lrs)]
            for group, lr in zip(scheduler.optimizer.param_groups, lrs):
                group["lr"] = lr
            scheduler._last_lr = lrs
            self._vlp_unread_skips.sub_(1.0)

        def _device_lrs(self) -> None:
            sched = self._vlp_schedule
            if sched is None:
                return
            index = self._vlp_index - self._vlp_unread_skips
            for fn, base, lr in zip(sched.lr_lambdas, sched.base_lrs, self._vlp_lr):
                lr.copy_(device_multiplier(fn, index) * base)

        @torch.no_grad()
        def step(self, closure=None):
            if closure is not None:
                raise NotImplementedError(f"{type(self).__name__} does not support closure")
            if not _capturing():   # a fill in a graph would replay the capture's lr
                self.prepare_step()
            self.device_step()

        @torch.no_grad()
        def device_step(self) -> None:
            """Norm, clip, the skip flag, AdamW, the bf16 copy of the weights, the gradient
            clearing: device operations and collectives only."""
            self.overflow = False          # the host does not know: the flag is on the device
            grads = self.get_grads_for_norm(for_clipping=True)
            norm = torch.stack([g.float().norm(2.0) for g in grads]).pow(2.0).sum().pow(0.5)
            bad = ~torch.isfinite(norm)
            flag = getattr(self, "_vlp_skip_flag", None)
            if flag is not None:
                bad = bad | (flag.reshape(()) != 0)
                self._vlp_skip_flag = None
            self.found_inf.copy_(bad)
            # DeepSpeed reports an invalid norm as inf. Into a tensor of its own, made before
            # any capture: each captured step (one per batch shape) writes the same one
            self._vlp_norm.copy_(torch.where(bad, torch.full_like(norm, float("inf")), norm))
            self._global_grad_norm = self._vlp_norm
            if self.clip_grad > 0.0:
                coef = (self.clip_grad / (norm + CLIP_EPS)).clamp(max=1.0)
                torch._foreach_mul_(grads, coef)
            for param, grad in zip(self.fp32_groups_flat_partition,
                                   self.fp32_groups_gradient_flat_partition):
                param.grad = grad if grad.dtype == param.dtype else grad.to(param.dtype)
            self._device_lrs()
            inner, floats = self.optimizer, []
            for group, lr in zip(inner.param_groups, self._vlp_lr):
                floats.append(group["lr"])
                group["lr"] = lr
            inner.found_inf = self.found_inf
            try:
                inner.step()
            finally:
                for group, lr in zip(inner.param_groups, floats):
                    group["lr"] = lr
                inner.found_inf = None
            self._vlp_unread_skips.add_(self.found_inf)
            if self.grad_acc_dtype is not torch.float32:
                for param in self.fp32_groups_flat_partition:
                    param.grad = None
            self._lazy_init_hp_params_optimizer_state()
            self.update_lp_params()        # a skipped update copies the same weights back
            self.clear_hp_grads()

    return DeviceStepBF16Optimizer


def _capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def unsupported_reason(optimizer: Any) -> str | None:
    """Why ``optimizer`` keeps DeepSpeed's step; None if the device step applies."""
    if not uses_flat_bookkeeping(optimizer):
        return "not DeepSpeed's BF16 optimizer with the flat bookkeeping"
    inner = getattr(optimizer, "optimizer", None)
    if not isinstance(inner, torch.optim.AdamW) or not all(
            g.get("fused") for g in inner.param_groups):
        return (f"the inner optimizer is {type(inner).__name__} without fused=True "
                f"(optimizer.impl: auto or torch-fused takes torch's fused AdamW)")
    if getattr(optimizer, "_uses_muon", False):
        return "the Muon optimizer"
    if len(optimizer.fp32_groups_flat_partition) != len(inner.param_groups):
        return "parameter groups that are not one flat partition each"
    return None


def uses_device_step(optimizer: Any) -> bool:
    return type(optimizer) is _device_class()


def use_device_step(optimizer: Any) -> bool:
    """Switch the flat-bookkeeping bf16 optimizer to the device step where it applies; True
    if it did. Any other optimizer is left as it is."""
    reason = unsupported_reason(optimizer)
    if reason is not None:
        if uses_flat_bookkeeping(optimizer):
            log.info("bf16 optimizer: DeepSpeed's step kept (%s)", reason)
        return False
    device = optimizer.fp32_groups_flat_partition[0].device
    optimizer._vlp_lr = [torch.tensor(float(g["lr"]), dtype=torch.float32, device=device)
                         for g in optimizer.optimizer.param_groups]
    optimizer.found_inf = torch.zeros((), dtype=torch.float32, device=device)
    optimizer._vlp_norm = torch.zeros((), dtype=torch.float32, device=device)
    optimizer._vlp_skip_flag = None
    optimizer._vlp_schedule = None
    optimizer._vlp_index = torch.zeros((), dtype=torch.float32, device=device)
    optimizer._vlp_unread_skips = torch.zeros((), dtype=torch.float32, device=device)
    optimizer.__class__ = _device_class()
    return True


def attach_schedule(optimizer: Any, scheduler: Any) -> bool:
    """Compute the device step's lr on the device from ``scheduler`` (so that a skipped
    update does not advance it) where it is vlp's schedule: a ``LambdaLR`` whose every
    multiplier is a ``WarmupLinearDecay``; True if attached."""
    if not uses_device_step(optimizer):
        return False
    if type(scheduler) is not torch.optim.lr_scheduler.LambdaLR or not all(
            isinstance(fn, WarmupLinearDecay) for fn in scheduler.lr_lambdas):
        log.info("bf16 device step: the lr comes from the host (a schedule other than "
                 "vlp's: a skipped update advances it)")
        return False
    optimizer._vlp_schedule = scheduler
    return True
