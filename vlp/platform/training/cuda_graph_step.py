"""``train.cuda_graphs``: the whole optimizer step — forward, loss, backward, the gradient
bookkeeping, clip, skip flag and AdamW — captured as one CUDA graph per batch shape and
replayed, so that the host launches one graph where it dispatched ~1,900 operations.

Per (task, tensor shapes and dtypes) key: the first batch runs eagerly (the warm-up: lazy
initialisation, Adam's state, cuBLAS's workspaces, autotuning, all outside any capture);
the next one is copied into static input buffers (clones of that batch), the step captured
with them, then replayed; every later one is copied into the same buffers and replayed.
A capture does not run its kernels, so no step runs twice or is lost: the eager warm-up is
a step, the capture's replay is the next one.

All graphs share one memory pool: they run one after another on one stream, and each
graph's static inputs and outputs stay referenced by its entry, so no capture reuses memory
another graph reads after its replay (the pool's temporaries are free between replays).

What the host does around a replay, because a replay runs kernels only: the learning rate
goes into the optimizer's device tensor before it (``prepare_step``: a fill captured in the
graph would replay the capture step's value), and DeepSpeed's host-side counters and the lr
schedule move after it (``advance``), as ``engine.step`` moves them. Where it applies: the
device step (``device_step.py``), one micro-batch per step, one rank (the capture of
DeepSpeed's gradient all-reduce across ranks is not yet verified); ``check`` says why not
in one line otherwise.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Any, Callable

import torch

from vlp.contract import batch_spec as bs
from vlp.contract.batch_access import host_rows

Step = Callable[[Any, dict[str, Any]], dict[str, torch.Tensor]]


def check(device: torch.device, grad_accum: int, world_size: int, device_step: bool,
          on_nonfinite: str = "raise") -> str | None:
    """Why ``train.cuda_graphs`` cannot run here (one line), or None."""
    if device.type != "cuda":
        return (f"train.cuda_graphs: needs a CUDA device, and this worker runs on "
                f"{device.type}; set train.cuda_graphs false")
    if grad_accum != 1:
        return (f"train.cuda_graphs: captures steps of one micro-batch, and "
                f"train.grad_accum is {grad_accum}")
    if world_size != 1:
        return (f"train.cuda_graphs: one worker only for now ({world_size} workers: the "
                f"capture of DeepSpeed's gradient all-reduce is not yet verified)")
    if on_nonfinite != "raise":
        return ("train.cuda_graphs: on_nonfinite skip decides on the host before each "
                "backward; the captured step skips a non-finite update on the device")
    if not device_step:
        return ("train.cuda_graphs: needs the device step (bf16 under ZeRO-1 with torch's "
                "fused AdamW: optimizer.impl auto); this engine's step reads values back")
    return None


def shape_key(task: Any, batch: dict[str, Any]) -> tuple:
    """The task, every tensor's name, shape and dtype, and what the model decides on the host
    from the batch's host integers (the packed row length, whether rows are padded: a
    capture keeps both), nested dicts included."""
    return (str(task),) + tuple(sorted(_signature(batch)))   # names unique: no value compared


def _signature(batch: dict[str, Any], prefix: str = ""):
    if bs.INPUT_IDS in batch:
        yield (prefix + "host_rows", host_rows(batch))
    for k, v in batch.items():
        if torch.is_tensor(v):
            yield (prefix + k, tuple(v.shape), str(v.dtype))
        elif isinstance(v, dict):
            yield from _signature(v, f"{prefix}{k}.")


def copy_into(static: dict[str, Any], batch: dict[str, Any]) -> None:
    """The batch's tensors into the static buffers of its shape (non-tensors are the
    capture's: the key holds only tensors, so they must not differ in what they mean)."""
    for k, v in batch.items():
        if torch.is_tensor(v):
            static[k].copy_(v, non_blocking=True)
        elif isinstance(v, dict):
            copy_into(static[k], v)


def _clone(batch: dict[str, Any]) -> dict[str, Any]:
    return {k: v.clone() if torch.is_tensor(v) else _clone(v) if isinstance(v, dict) else v
            for k, v in batch.items()}


class CudaGraph:
    """One captured step on CUDA (``torch.cuda.CUDAGraph`` in the shared pool)."""

    def __init__(self, step: Callable[[dict[str, Any]], dict[str, torch.Tensor]],
                 static: dict[str, Any], pool: Any):
        self.graph = torch.cuda.CUDAGraph()
        # capture on a side stream that waits for the work before it (torch's recipe)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        # thread_local: the prefetch thread goes on pinning and copying the next batches on
        # its own stream during the capture, which the default (global) mode forbids
        with torch.cuda.stream(stream), torch.cuda.graph(self.graph, pool=pool, stream=stream,
                                                         capture_error_mode="thread_local"):
            self.outputs = step(static)
        torch.cuda.current_stream().wait_stream(stream)

    def replay(self) -> dict[str, torch.Tensor]:
        self.graph.replay()
        return self.outputs


@dataclass
class _Entry:
    static: dict[str, Any]
    graph: Any


class GraphedSteps:
    """Steps keyed by shape: eager the first time, captured the second, replayed after.

    ``step(task, batch)`` runs one whole step and returns its outputs (device tensors);
    ``prepare()`` is the host's part before a step (the lr into its device tensor), and
    ``advance()`` what the host must move after a replay (DeepSpeed's counters, the lr
    schedule), which an eager step or a capture moves by itself. ``make_graph(step,
    static, pool)`` captures (``CudaGraph`` on CUDA)."""

    def __init__(self, step: Step, prepare: Callable[[], None], advance: Callable[[], None],
                 make_graph: Callable[..., Any] = CudaGraph, pool: Any = None):
        self.step, self.prepare, self.advance = step, prepare, advance
        self.make_graph = make_graph
        self.pool = pool if pool is not None or make_graph is not CudaGraph else \
            torch.cuda.graph_pool_handle()
        self.entries: dict[tuple, _Entry] = {}
        self.seen: collections.Counter = collections.Counter()
        self.counts = collections.Counter()    # eager, captured, replayed

    def __call__(self, task: Any, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        key = shape_key(task, batch)
        entry = self.entries.get(key)
        self.prepare()
        if entry is None and not self.seen[key]:
            self.seen[key] += 1
            self.counts["eager"] += 1
            return self.step(task, batch)
        if entry is None:
            static = _clone(batch)
            entry = self.entries[key] = _Entry(static, self.make_graph(
                lambda b: self.step(task, b), static, self.pool))
            self.counts["captured"] += 1
            # the capture ran the step's Python once, host counters and schedule included
            return entry.graph.replay()
        copy_into(entry.static, batch)
        out = entry.graph.replay()
        self.counts["replayed"] += 1
        self.advance()
        return out


def engine_steps(engine: Any) -> GraphedSteps:
    """``GraphedSteps`` over a DeepSpeed engine with the device step: forward, loss, the
    skip flag from this rank's losses, backward and ``engine.step``."""
    from vlp.platform.training import objective

    def step(task: Any, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        out = objective.forward(engine, batch, task)
        losses = torch.stack([v.detach().float().reshape(()) for k, v in out.items()
                              if k.endswith("loss")])
        engine.optimizer.skip_if((~torch.isfinite(losses)).any())
        engine.backward(out["loss"])
        engine.step()
        return {k: v.detach() for k, v in out.items()}

    def advance() -> None:
        # what engine.backward and engine.step move on the host (one micro-batch per step)
        engine.micro_steps += 1
        engine.global_steps += 1
        engine.global_samples += engine.train_batch_size()
        if engine.lr_scheduler is not None:
            engine.lr_scheduler.step()

    return GraphedSteps(step, engine.optimizer.prepare_step, advance)
