"""The GPU check's timed passes over batches already on the device: the bare loop, the steady
variants in alternated rounds (cuDNN SDPA, fused/separate QKV, DeepSpeed's step, CUDA graphs,
beside the batcher), the micro-batch sweep's second pass and static compile.

Every training run goes through the local runner (``run_local``: the loop, DeepSpeed's
engine, the prefetcher, the local batch stream, checkpoints to a folder), the path that a
Ray worker runs, without Ray. Each function returns a dict of figures.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable

import torch

from vlp.models.fused_qkv import FusedQKVSelfAttention, fuse_qkv, separate_qkv
from vlp.platform.gpu_check.batcher_load import beside_batcher
from vlp.platform.training import objective
from vlp.platform.training.bf16_bookkeeping import _flat_class, uses_flat_bookkeeping
from vlp.platform.training.cuda_graph_step import check as graphs_problem, engine_steps
from vlp.platform.training.device_step import uses_device_step


def device_sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)




def train_steps(engine, items: list) -> None:
    for item in items:
        out = objective.forward(engine, item.batch, item.task)
        engine.backward(out["loss"])
        engine.step()


def phased_steps(engine, items: list, around: Callable[[str], Any]) -> None:
    """Training steps with ``around(phase)`` (a context manager) around each phase: forward
    (with the loss), backward, optimizer step."""
    for item in items:
        with around("forward"):
            out = objective.forward(engine, item.batch, item.task)
        with around("backward"):
            engine.backward(out["loss"])
        with around("step"):
            engine.step()


def pass_s(engine, items: list, device: torch.device) -> float:
    """Seconds of one pass over ``items``, the device's work included."""
    device_sync(device)
    t0 = time.perf_counter()
    train_steps(engine, items)
    device_sync(device)
    return time.perf_counter() - t0


def second_pass_s(engine, items: list, device: torch.device) -> float:
    """Seconds of a second pass over ``items`` (the first meets every shape once)."""
    train_steps(engine, items)
    return pass_s(engine, items, device)


def graphed_steps(engine, device: torch.device) -> tuple[Any, str | None]:
    """``train.cuda_graphs``' steps over ``engine`` (cuda_graph_step.py), or None and the
    line that says why not here."""
    problem = graphs_problem(device, engine.gradient_accumulation_steps(), 1,
                             uses_device_step(engine.optimizer))
    return (None, problem) if problem else (engine_steps(engine), None)


def graphed_pass_s(graphed, items: list, device: torch.device, warm: int = 2) -> float:
    """Seconds of a pass over ``items`` replaying captured steps, after ``warm`` passes (two
    for shapes never met: the first runs each eagerly, the second captures it; one, as
    ``second_pass_s``, once they are captured)."""
    for _ in range(warm):
        for item in items:
            graphed(item.task, item.batch)
    device_sync(device)
    t0 = time.perf_counter()
    for item in items:
        graphed(item.task, item.batch)
    device_sync(device)
    return time.perf_counter() - t0


def bare_loop(engine, items: list, device: torch.device) -> dict[str, float]:
    """The same engine on batches already on the device: forward, backward, step and
    nothing else (no prefetch, no statistics all-reduce, no records or reports)."""
    train_steps(engine, items[:2])   # warm-up
    wall = pass_s(engine, items[2:], device)
    units = sum(i.input_units for i in items[2:])
    return {"bare_s_per_input_unit": wall / units, "bare_steps": len(items) - 2}


def steady_bare(engine, items: list, device: torch.device, batcher_cfg=None,
                rounds: int = 2) -> dict[str, Any]:
    """The bare loop's second pass over the same batches (every shape seen once before: no
    first-shape costs such as kernel plans or allocator growth) in several variants: SDPA's
    cuDNN kernel allowed and refused (the memory-efficient kernel then takes vlp's mask);
    for a bf16 ZeRO-1 engine, DeepSpeed's own per-parameter optimizer bookkeeping in place
    of vlp's flat one (bf16_bookkeeping.py); ``transformers``' three query, key and value
    projections in place of vlp's one (fused_qkv.py); attention over each row's real tokens
    (``transformer.attention: varlen``, varlen_attention.py: one spare slot a row) in place of
    the padded kernel; with ``batcher_cfg``'s batches built beside it,
    on a thread (the prefetcher's way: the GIL shared with the dispatching thread) and in a
    separate process. The variants take turns, ``rounds`` times (A B C A B C): a pass can
    run slower than the same pass before it, and ``order_drift`` (the last round over the
    first, averaged over the variants) says how much."""
    units = sum(i.input_units for i in items)
    configured = "cudnn_sdpa" if torch.backends.cuda.cudnn_sdp_enabled() else "no_cudnn_sdpa"

    def timed() -> float:
        return second_pass_s(engine, items, device)

    variants: dict[str, Callable[[], float]] = {
        "no_cudnn_sdpa": lambda: _with_cudnn_sdpa(False, timed),
        "cudnn_sdpa": lambda: _with_cudnn_sdpa(True, timed)}
    if uses_flat_bookkeeping(engine.optimizer):   # against the classes it was switched from
        flat = _flat_class()
        variants["deepspeed_bookkeeping"] = lambda: _with_class(
            engine.optimizer, flat.__bases__[0], timed)
        if uses_device_step(engine.optimizer):    # DeepSpeed's step: 4 host syncs
            variants["deepspeed_step"] = lambda: _with_class(engine.optimizer, flat, timed)
    graphed, no_graphs = graphed_steps(engine, device)
    if graphed is not None:     # the whole step captured per shape (train.cuda_graphs)
        try:    # every shape met and captured once before the rounds: a failure is said
            graphed_pass_s(graphed, items, device)
            variants["cuda_graphs"] = lambda: graphed_pass_s(graphed, items, device, warm=1)
        except Exception as e:   # noqa: BLE001 - the check goes on without the variant
            no_graphs = f"capture failed: {type(e).__name__}: {str(e).strip()[:300]}"
    if any(isinstance(m, FusedQKVSelfAttention) for m in engine.module.modules()):
        variants["separate_qkv"] = lambda: _with_separate_qkv(engine.module, timed)
    backbones = _padded_backbones(engine.module)
    if backbones:   # attention over each row's real tokens (varlen_attention.py)
        variants["varlen_attention"] = lambda: _with_varlen(backbones, timed)
    rates: dict[str, list[float]] = {}
    for where in ("thread", "process") if batcher_cfg is not None else ():
        def beside(where: str = where) -> float:
            seconds, rate = beside_batcher(batcher_cfg, where, timed)
            rates.setdefault(where, []).append(rate)
            return seconds
        variants[f"beside_batcher_{where}"] = beside
    times: dict[str, list[float]] = {label: [] for label in variants}
    failed: dict[str, str] = {}
    for _ in range(rounds):
        for label, fn in variants.items():
            if label in failed:
                continue
            try:
                times[label].append(fn() / units)
            except Exception as e:   # noqa: BLE001 - one variant's failure loses only it
                if label == configured:   # the baseline: nothing to compare without it
                    raise
                failed[label] = f"{type(e).__name__}: {str(e).strip()[:300]}"
                del times[label]
    out: dict[str, Any] = {"steps": len(items), "rounds": rounds, "configured": configured}
    if failed:
        out["variants_failed"] = failed
    for label, ts in times.items():
        out[f"{label}_s_per_input_unit"] = statistics.fmean(ts)
        out[f"{label}_rounds"] = ts
    out["order_drift"] = statistics.fmean(ts[-1] / ts[0] for ts in times.values())
    alone = out[f"{configured}_s_per_input_unit"]
    for where, r in rates.items():
        if f"beside_batcher_{where}" not in times:
            continue
        out[f"beside_batcher_{where}_over_alone"] = \
            out[f"beside_batcher_{where}_s_per_input_unit"] / alone
        out[f"beside_batcher_{where}_batches_per_s"] = statistics.fmean(r)
    if "deepspeed_bookkeeping" in times:
        out["flat_over_deepspeed_bookkeeping"] = \
            alone / out["deepspeed_bookkeeping_s_per_input_unit"]
    if no_graphs:
        out["cuda_graphs_refused"] = no_graphs
    if "cuda_graphs" in times:
        out["graphs_over_eager"] = out["cuda_graphs_s_per_input_unit"] / alone
        out["graphs_captured"] = graphed.counts["captured"]
    if "deepspeed_step" in times:
        out["device_step_over_deepspeed_step"] = \
            alone / out["deepspeed_step_s_per_input_unit"]
    if "separate_qkv" in times:
        out["fused_over_separate_qkv"] = alone / out["separate_qkv_s_per_input_unit"]
    if "varlen_attention" in times:
        out["varlen_over_padded_attention"] = out["varlen_attention_s_per_input_unit"] / alone
    return out


def _with_cudnn_sdpa(on: bool, fn: Callable[[], float]) -> float:
    before = torch.backends.cuda.cudnn_sdp_enabled()
    torch.backends.cuda.enable_cudnn_sdp(on)
    try:
        return fn()
    finally:
        torch.backends.cuda.enable_cudnn_sdp(before)


def _with_separate_qkv(model: torch.nn.Module, fn: Callable[[], float]) -> float:
    separate_qkv(model)
    try:
        return fn()
    finally:
        fuse_qkv(model)


def _padded_backbones(model: torch.nn.Module) -> list:
    from vlp.models.backbone import VLBackbone

    found = [m for m in model.modules() if isinstance(m, VLBackbone)]
    return found if found and all(m.attention_layout == "padded" for m in found) else []


def _with_varlen(backbones: list, fn: Callable[[], float]) -> float:
    for b in backbones:
        b.set_attention_layout("varlen")
    try:
        return fn()
    finally:
        for b in backbones:
            b.set_attention_layout("padded")


def _with_class(obj: Any, cls: type, fn: Callable[[], float]) -> float:
    before = type(obj)
    obj.__class__ = cls
    try:
        return fn()
    finally:
        obj.__class__ = before


def compiled_steady(engine, batches: dict[int, list], device: torch.device) -> dict[str, Any]:
    """Eager, CUDA graphs, ``torch.compile`` with static shapes (``train.compile``:
    compile_static.py, the whole model, fullgraph, dynamic=False) and compile + graphs on
    one engine and the same batches, each timed on a pass after every shape was met (and,
    with graphs, captured), for each micro-batch size in ``batches``; the first compiled
    pass's seconds (compilation included), and dynamo's graph, recompile and graph-break
    counts. Graphs run only where ``train.cuda_graphs`` would (``graphs_refused`` says why
    not)."""
    from torch._dynamo.utils import counters

    from vlp.platform.training.compile_static import compile_static

    model = engine.module
    out: dict[str, Any] = {}
    for units, items in batches.items():
        n = sum(i.input_units for i in items)
        row = out[f"units_{units}"] = {
            "eager_s_per_input_unit": second_pass_s(engine, items, device) / n}
        graphed, out["graphs_refused"] = graphed_steps(engine, device)
        if graphed is not None:
            row["graphs_s_per_input_unit"] = graphed_pass_s(graphed, items, device) / n
    torch._dynamo.reset()
    counters.clear()
    compile_static(model)
    try:
        for units, items in batches.items():
            n = sum(i.input_units for i in items)
            row = out[f"units_{units}"]
            row["first_compiled_pass_s"] = pass_s(engine, items, device)
            row["compiled_s_per_input_unit"] = pass_s(engine, items, device) / n
            row["compiled_over_eager"] = (row["compiled_s_per_input_unit"]
                                          / row["eager_s_per_input_unit"])
            graphed, _ = graphed_steps(engine, device)
            if graphed is not None:
                row["compiled_graphs_s_per_input_unit"] = \
                    graphed_pass_s(graphed, items, device) / n
                row["compiled_graphs_over_eager"] = (row["compiled_graphs_s_per_input_unit"]
                                                     / row["eager_s_per_input_unit"])
        out["unique_graphs"] = counters["stats"]["unique_graphs"]
        out["frames_compiled"] = counters["stats"]["calls_captured"]
        out["graph_breaks"] = sum(counters["graph_break"].values())
        out["recompiles"] = sum(v for k, v in counters["recompiles"].items()) \
            if "recompiles" in counters else None
    finally:
        model._compiled_call_impl = None   # undo Module.compile: eager again
    return out
