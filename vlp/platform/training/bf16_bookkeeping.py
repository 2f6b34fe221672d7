"""DeepSpeed's BF16 optimizer with its per-parameter bookkeeping done on whole lists.

``BF16_Optimizer`` (what a bf16 run under ZeRO-1 gets, so that gradients accumulate in
fp32) keeps one flat fp32 gradient buffer per parameter group, with a view per parameter.
After every backward it adds each parameter's bf16 gradient into its view from Python, one
parameter at a time (a detach, a cast, a view and an add each); in the step it takes the
gradient norm, and clips, one view at a time. On a GPU that is several operations per
parameter tensor for the host to dispatch, in a step the host already bounds (the GPU
check's ``host_ops``).

``use_flat_bookkeeping`` gives the optimizer a subclass that does the same arithmetic on
whole lists, the bf16 → fp32 cast inside each operation: a multi-tensor copy into the views
that hold no gradient yet in this step (zeros, so the copy is the sum; a step without
accumulation is all copy, which CUDA runs as multi-tensor kernels across the two dtypes,
where an add of bf16 into fp32 falls back to a kernel per tensor), a multi-tensor add into
the others; and the norm and the clip over the flat buffers those views live in. The
buffers hold zeros outside the gradients of this step (padding, parameters no loss
reached), so the norm is the same up to the order of summation.

It applies only where that holds and nothing else reads the per-view lists: no model or
pipeline parallelism, no mixture of experts, no Muon, gradients not taken by hooks as they
are produced (``immediate_grad_update``). Elsewhere the optimizer is left as it is.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import torch

from vlp.platform.training.deepspeed_import import load_deepspeed

log = logging.getLogger(__name__)

# what the subclass reads of BF16_Optimizer's state (checked, so that a DeepSpeed release
# that renames them leaves the optimizer alone instead of breaking it)
_STATE = ("bf16_groups", "fp32_groups_gradients", "fp32_groups_gradients_flat",
          "fp32_groups_has_gradients", "immediate_grad_update", "has_moe_layers", "mpu")


@functools.cache
def _flat_class() -> type:
    load_deepspeed()   # before any deepspeed import: deepspeed_import.py
    from deepspeed.runtime.bf16_optimizer import BF16_Optimizer

    class FlatBookkeepingBF16Optimizer(BF16_Optimizer):
        """``BF16_Optimizer`` whose gradient accumulation, norm and clip take whole lists."""

        @torch.no_grad()
        def update_hp_grads(self, clear_lp_grads: bool = False) -> None:
            exchange = getattr(self, "_vlp_exchange", None)   # grad_exchange.py
            if exchange is not None and exchange.active and exchange.is_boundary():
                if not exchange.armed:    # no hook fired: every gradient is added here
                    self._vlp_add_hp_grads(clear_lp_grads)
                # armed: the hooks took every gradient this backward produced; the rest are
                # zeros (cleared before the backward) over buffers now in flight
                exchange.finish()
                if clear_lp_grads:
                    torch._foreach_zero_([p.grad for g in self.bf16_groups for p in g
                                          if p.grad is not None])
                return
            self._vlp_add_hp_grads(clear_lp_grads)

        def _vlp_add_hp_grads(self, clear_lp_grads: bool) -> None:
            for i, group in enumerate(self.bf16_groups):
                views, shaped = self.fp32_groups_gradients[i], self._vlp_shaped_hp_grads[i]
                has = self.fp32_groups_has_gradients[i]
                present = [j for j, lp in enumerate(group) if lp.grad is not None]
                if not present:
                    continue
                # a view with no gradient yet in this step holds zeros (clear_hp_grads)
                fresh = [j for j in present if not has[j]]
                again = [j for j in present if has[j]]
                for picked, op in ((fresh, torch._foreach_copy_), (again, torch._foreach_add_)):
                    if picked:
                        op([shaped[j] for j in picked], [group[j].grad for j in picked])
                for j in present:
                    group[j]._hp_grad = views[j]
                    has[j] = True
                if clear_lp_grads:
                    torch._foreach_zero_([group[j].grad for j in present])

        @torch.no_grad()
        def get_grads_for_norm(self, for_clipping: bool = False):
            flat = list(self.fp32_groups_gradients_flat)
            return flat if for_clipping else (flat, {})

    return FlatBookkeepingBF16Optimizer


def unsupported_reason(optimizer: Any) -> str | None:
    """Why ``optimizer`` (a ``BF16_Optimizer``) must keep its own bookkeeping; None if the
    flat one applies."""
    missing = [name for name in _STATE if not hasattr(optimizer, name)]
    if missing:
        return f"this DeepSpeed's BF16_Optimizer has no {', '.join(missing)}"
    if optimizer.immediate_grad_update:
        return "gradients are accumulated by hooks as they are produced"
    if optimizer.has_moe_layers or optimizer.mpu is not None:
        return "mixture of experts or model parallelism"
    if getattr(optimizer, "_uses_muon", False):
        return "the Muon optimizer"
    if getattr(optimizer, "autoep_folding_tp_group", None) is not None:
        return "tensor-parallel expert folding"
    return None


def uses_flat_bookkeeping(optimizer: Any) -> bool:
    """Whether ``use_flat_bookkeeping`` switched ``optimizer`` (its class is then the flat
    subclass of DeepSpeed's ``BF16_Optimizer``, or the device step's subclass of that:
    ``device_step.py``)."""
    return "BF16Optimizer" in type(optimizer).__name__ and isinstance(optimizer, _flat_class())


def use_flat_bookkeeping(optimizer: Any) -> bool:
    """Switch a ``BF16_Optimizer`` to the flat bookkeeping where it applies; True if it did.
    Any other optimizer is left alone (False)."""
    try:
        load_deepspeed()   # before any deepspeed import: deepspeed_import.py
        from deepspeed.runtime.bf16_optimizer import BF16_Optimizer
    except ImportError:
        return False
    if type(optimizer) is not BF16_Optimizer:
        return False
    reason = unsupported_reason(optimizer)
    if reason is not None:
        log.info("bf16 optimizer: per-parameter bookkeeping kept (%s)", reason)
        return False
    # each parameter's fp32 gradient view, shaped as the parameter (the views are flat):
    # the multi-tensor add then needs no per-parameter view of the bf16 gradient
    optimizer._vlp_shaped_hp_grads = [
        [view.view(lp.shape) for view, lp in zip(views, group)]
        for views, group in zip(optimizer.fp32_groups_gradients, optimizer.bf16_groups)]
    optimizer.__class__ = _flat_class()
    return True
