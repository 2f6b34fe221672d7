"""The gradient all-reduce overlapped with the backward (``train.grad_overlap``).

DeepSpeed's BF16 optimizer under ZeRO-1 (what a bf16 job on several GPUs runs) ignores
``overlap_comm`` and the bucket sizes: after the last micro-batch's backward it adds the
bf16 gradients into its fp32 buffer and all-reduces that buffer, so the whole exchange sits
between the backward and the optimizer step (uniter-base: 452 MB a step).

``use_overlapped_exchange`` starts it during the backward instead. Each fp32 gradient buffer
(one per parameter group) is cut into buckets of consecutive parameters, laid out from the
buffer's end (the layers the backward reaches first). On the last micro-batch of a step a
post-accumulate-grad hook on each bf16 parameter adds its gradient into its fp32 view at
once (the flat bookkeeping would do it after the backward), and a bucket whose parameters
all hold this step's gradient is launched as an asynchronous all-reduce while the backward
goes on through the earlier layers. After the backward the rest are launched and all are
waited for, then divided by the world size (DeepSpeed's post-scaling: the same sum and the
same multiply, so the same fp32 result up to the order the collective sums in).

- Every rank launches the buckets in one fixed order (a bucket is launched only after the
  ones before it): ranks whose backward reaches parameters in another order (another task)
  still pair their collectives.
- Parameters that this backward will not reach (another task's head) are known at its first
  hook (``torch._C._will_engine_execute_node``, what torch's FSDP asks), so their buckets
  need not wait for the end; their fp32 views hold the step's earlier micro-batches already.
- Accumulation stays in fp32; the wire dtype is ``train.grad_wire_dtype`` (fp32 by default:
  docs/cluster.md has the 200-step loss difference that chose it).
- No host sync: the hooks queue device work and collectives; ``wait`` on a CUDA work makes
  the compute stream wait for NCCL's, the host does not.

Applies where the flat bookkeeping does (``bf16_bookkeeping.py``) and there are several
ranks; elsewhere DeepSpeed's own reduction runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.distributed as dist

WIRE_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


@dataclass
class Bucket:
    group: int                     # parameter group (its fp32 buffer)
    start: int                     # elements of that buffer, [start, end)
    end: int
    members: list[int]             # parameter indices within the group
    pending: int = 0               # expected members without this step's gradient
    work: Any = None
    wire: torch.Tensor | None = None


@dataclass
class ExchangeStats:
    """What the last steps did, for tests and benchmarks (host counters only)."""
    hooks_at_launch: list[int] = field(default_factory=list)   # hooks fired at each launch
    hooks: int = 0


def _will_execute(node: Any) -> bool:
    will = getattr(torch._C, "_will_engine_execute_node", None)
    if will is None or node is None:
        return True
    try:
        return bool(will(node))
    except RuntimeError:           # outside a backward: assume it will
        return True


class OverlappedExchange:
    """The buckets, the hooks and the per-step state of one bf16 optimizer's exchange."""

    def __init__(self, optimizer: Any, is_boundary: Callable[[], bool],
                 bucket_elements: int, wire_dtype: str = "fp32") -> None:
        self.opt, self.is_boundary = optimizer, is_boundary
        self.wire = WIRE_DTYPES[wire_dtype]
        self.active = True
        self.stats = ExchangeStats()
        self.buckets: list[Bucket] = []
        self.bucket_of: dict[tuple[int, int], int] = {}
        order_key: list[int] = []
        for i, (flat, views) in enumerate(zip(optimizer.fp32_groups_gradients_flat,
                                               optimizer.fp32_groups_gradients)):
            offsets = [v.storage_offset() - flat.storage_offset() for v in views]
            end, members, size = flat.numel(), [], 0
            for j in range(len(views) - 1, -1, -1):
                members.append(j)
                size += views[j].numel()
                if size >= bucket_elements or j == 0:
                    start = 0 if j == 0 else offsets[j]
                    self.buckets.append(Bucket(i, start, end, members))
                    end, members, size = start, [], 0
        # launch order: by where each bucket's last parameter sits in the model (what the
        # backward reaches first), the groups interleaved as the layers are
        position = {id(p): k for k, p in enumerate(
            p for group in optimizer.bf16_groups for p in group)}
        model_order = getattr(optimizer, "_vlp_model_order", None) or position
        for b in self.buckets:
            order_key.append(max(model_order.get(id(optimizer.bf16_groups[b.group][j]), 0)
                                 for j in b.members))
        self.buckets = [b for _, b in sorted(zip(order_key, self.buckets),
                                             key=lambda kb: -kb[0])]
        for n, b in enumerate(self.buckets):
            for j in b.members:
                self.bucket_of[(b.group, j)] = n
        self.nodes = {}
        self.handles = []
        for i, group in enumerate(optimizer.bf16_groups):
            for j, p in enumerate(group):
                self.nodes[(i, j)] = torch.autograd.graph.get_gradient_edge(p).node
                self.handles.append(p.register_post_accumulate_grad_hook(
                    self._hook_for(i, j)))
        self._reset()

    def _reset(self) -> None:
        self.armed = False
        self.taken: set[tuple[int, int]] = set()
        self.next_launch = 0

    # the backward's side ----------------------------------------------------------------

    def _hook_for(self, i: int, j: int) -> Callable[[torch.Tensor], None]:
        def hook(param: torch.Tensor) -> None:
            if self.active and self.is_boundary():
                self._take(i, j, param)
        return hook

    def _arm(self) -> None:
        """At the boundary backward's first hook: which parameters it will reach."""
        self.armed = True
        for b in self.buckets:
            b.pending = sum(1 for j in b.members if _will_execute(self.nodes[(b.group, j)]))

    @torch.no_grad()
    def _take(self, i: int, j: int, param: torch.Tensor) -> None:
        if not self.armed:
            self._arm()
        if (i, j) in self.taken or param.grad is None:
            return
        opt = self.opt
        view = opt._vlp_shaped_hp_grads[i][j]
        if opt.fp32_groups_has_gradients[i][j]:
            view.add_(param.grad)
        else:                          # zeros until now (clear_hp_grads): the copy is the sum
            view.copy_(param.grad)
        param._hp_grad = opt.fp32_groups_gradients[i][j]
        opt.fp32_groups_has_gradients[i][j] = True
        self.taken.add((i, j))
        self.stats.hooks += 1
        self.buckets[self.bucket_of[(i, j)]].pending -= 1
        self._launch_ready()

    def _launch_ready(self, everything: bool = False) -> None:
        while self.next_launch < len(self.buckets):
            b = self.buckets[self.next_launch]
            if b.pending > 0 and not everything:
                return
            self._launch(b)
            self.next_launch += 1

    def _launch(self, b: Bucket) -> None:
        flat = self.opt.fp32_groups_gradients_flat[b.group][b.start:b.end]
        b.wire = flat if flat.dtype == self.wire else flat.to(self.wire)
        b.work = dist.all_reduce(b.wire, group=self.opt.real_dp_process_group[b.group],
                                 async_op=True)
        self.stats.hooks_at_launch.append(self.stats.hooks)

    # after the backward ---------------------------------------------------------------

    @torch.no_grad()
    def finish(self) -> None:
        """Launch what is left, wait for all, divide by the world size."""
        self._launch_ready(everything=True)
        for b in self.buckets:
            b.work.wait()
            if b.wire is not None and b.wire.dtype != self.opt.fp32_groups_gradients_flat[
                    b.group].dtype:
                self.opt.fp32_groups_gradients_flat[b.group][b.start:b.end].copy_(b.wire)
            b.work, b.wire = None, None
        for i, flat in enumerate(self.opt.fp32_groups_gradients_flat):
            flat.mul_(1.0 / dist.get_world_size(group=self.opt.real_dp_process_group[i]))
        self._reset()


def use_overlapped_exchange(engine: Any, bucket_elements: int, wire_dtype: str = "fp32",
                            model: torch.nn.Module | None = None) -> OverlappedExchange | None:
    """Give ``engine``'s flat-bookkeeping bf16 optimizer the overlapped exchange and turn
    DeepSpeed's reduction after the backward off; None (nothing changed) where it does not
    apply."""
    from vlp.platform.training.bf16_bookkeeping import uses_flat_bookkeeping

    opt = engine.optimizer
    if not uses_flat_bookkeeping(opt) or not dist.is_initialized():
        return None
    if any(dist.get_world_size(group=g) < 2 for g in opt.real_dp_process_group):
        return None
    if model is not None:
        opt._vlp_model_order = {id(p): k for k, p in enumerate(model.parameters())}
    exchange = OverlappedExchange(opt, engine.is_gradient_accumulation_boundary,
                                  bucket_elements, wire_dtype)
    opt._vlp_exchange = exchange
    engine.enable_backward_allreduce = False
    return exchange
