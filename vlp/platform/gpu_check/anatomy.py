"""What a step is made of, for the GPU check: the profile's device time by category (profiler
annotations excluded), host syncs per phase, host operations dispatched, the SDPA kernels.

Every training run goes through the local runner (``run_local``: the loop, DeepSpeed's
engine, the prefetcher, the local batch stream, checkpoints to a folder), the path that a
Ray worker runs, without Ray. Each function returns a dict of figures.
"""

from __future__ import annotations

import collections
import contextlib
import time
import traceback
import warnings
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from vlp.platform.gpu_check.timing import device_sync, phased_steps, train_steps
from vlp.platform.training.host_syncs import HostSyncRecorder


def profile_steps(engine, items: list, device: torch.device, top: int = 10) -> dict[str, Any]:
    """torch.profiler over bare steps on batches seen before: the share of wall time the
    device was busy, and the kernels (or, on a CPU, operators) that took the most time."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda"
                                           else [])
    train_steps(engine, items)
    device_sync(device)
    with profile(activities=activities) as prof:
        t0 = time.perf_counter()
        train_steps(engine, items)
        device_sync(device)
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
    for it); on a CPU, the recorder of vlp.platform.training.host_syncs counts the operations that
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

    device_sync(device)
    with contextlib.ExitStack() as stack:
        if device.type == "cuda":   # switched once: switching can itself warn
            stack.enter_context(warnings.catch_warnings())
            warnings.simplefilter("always")
            warnings.showwarning = record
            torch.cuda.set_sync_debug_mode("warn")
            stack.callback(torch.cuda.set_sync_debug_mode, "default")
        phased_steps(engine, items, counting)
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

    phased_steps(engine, items, counting)
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
        device_sync(device)
        t0 = time.perf_counter()
        for _ in range(reps):
            once()
        device_sync(device)
        return (time.perf_counter() - t0) / reps

    out: dict[str, Any] = {"shape": [batch, heads, length, head_dim], "dtype": str(dtype),
                           "default_ms": timed() * 1e3}
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        once()
        device_sync(device)
    names = " ".join(e.name.lower() for e in prof.events())
    picked = ("cudnn" if "cudnn" in names else "flash" if "flash" in names
              else "mem_efficient" if "efficient" in names or "fmha" in names else "math")
    out["default_kernel"] = picked
    out.update(_varlen_kernel(device, q, k, v, lengths, dropout))
    if out.get("varlen_ms"):
        out["varlen_over_default"] = out["varlen_ms"] / out["default_ms"]
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


def _varlen_kernel(device: torch.device, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   lengths: torch.Tensor, dropout: float) -> dict[str, Any]:
    """The same rows through variable-length attention (``transformer.attention: varlen``,
    varlen_attention.py; the longest row keeps its one spare slot): the kernel SDPA on
    nested jagged tensors picks (on CUDA; a CPU runs the segments as a dense mask) and its
    forward+backward time against the padded kernel's default."""
    from vlp.models import varlen_attention as va

    length = q.shape[2]
    real = (torch.arange(length)[None] < lengths.clamp(max=length - 1)[:, None]).long()
    seg = va.segments(real.to(device), None if device.type == "cuda" else torch.bool)
    module = torch.nn.Module().train()
    out: dict[str, Any] = {}
    if device.type == "cuda":
        try:   # the backend SDPA on nested tensors picks (torch's own selection)
            from torch.nested._internal.sdpa import _select_sdp_backend

            nested = [va._jagged(x, seg, contiguous=False) for x in (q, k, v)]
            out["varlen_kernel"] = _select_sdp_backend(*nested, None, dropout, False,
                                                       False).name.lower()
        except Exception as e:   # noqa: BLE001 - a private function of torch's: say so
            out["varlen_kernel"] = f"unknown ({type(e).__name__}: {str(e)[:120]})"
    else:
        out["varlen_kernel"] = "dense_mask"

    def once():
        o, _ = va.vlp_varlen_attention(module, q, k, v, seg, dropout=dropout)
        o.sum().backward()

    try:
        out["varlen_ms"] = timed_fn(once, device) * 1e3
    except Exception as e:   # noqa: BLE001 - no kernel takes these rows here: said, not fatal
        out["varlen_ms"] = None
        out["varlen_refused"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
    return out


def timed_fn(once, device: torch.device, reps: int = 20) -> float:
    """Seconds per call of ``once`` after one untimed call, the device's work included."""
    once()
    device_sync(device)
    t0 = time.perf_counter()
    for _ in range(reps):
        once()
    device_sync(device)
    return (time.perf_counter() - t0) / reps
