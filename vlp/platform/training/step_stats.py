"""The training loop's statistics: the one all-reduce of an optimizer step (finiteness, the
ranks' agreement on tasks, the outputs' means, examples and input units) and the report
window's means and throughput (examples and input units per second, model FLOP/s, MFU, the
share of time spent waiting for data)."""

from __future__ import annotations

import collections
import math
import time
from typing import Any

import torch
import torch.distributed as dist

from vlp.platform.training.checkpointing import TrainerState
from vlp.platform.training.objective import task_id

# per-step record fields that are not model outputs (the rest: "loss", "mlm_loss", "mlm_acc")
BOOKKEEPING = frozenset({"step", "stage", "tasks", "lr", "global_batch_examples",
                         "global_batch_input_units", "global_batch_real_units",
                         "data_wait_s", "model_flops", "model_flops_real",
                         "step_time_s", "process_cpu_s"})


def step_clock() -> tuple[float, float]:
    """(wall, process CPU) seconds now: a step's ``step_time_s`` and ``process_cpu_s`` are the
    differences of two readings (CPU time of every thread of the worker: compute, prefetch,
    reports)."""
    return time.perf_counter(), time.process_time()


def step_vector(micro: list[tuple], task_ids: dict[str, int]
                ) -> tuple[torch.Tensor, list[list[str]]]:
    """The step's statistics as one float64 vector on the outputs' device, before the
    all-reduce: per micro-batch a non-finite-loss flag, the task id and its square; then
    examples, input units, the number of outputs and real (unpadded) units; then the
    outputs (non-finite ones as 0). Device operations and one host-to-device copy only.
    Also the output names, per micro-batch, in the vector's order."""
    flags, values, keys = [], [], []
    ids = [float(task_id(m[0], task_ids)) for m in micro]
    for out in (m[1] for m in micro):
        names = sorted(out)
        vals = torch.stack([out[k].float().reshape(()) for k in names])
        # the losses stacked apart: a mask or an index made from Python values would be a
        # host-to-device copy, which waits for the stream
        losses = [out[k].float().reshape(()) for k in names if k.endswith("loss")]
        flags.append((~torch.isfinite(torch.stack(losses))).any().float() if losses
                     else vals.new_zeros(()))
        values.append(torch.nan_to_num(vals, nan=0.0, posinf=0.0, neginf=0.0))
        keys.append(names)
    examples = sum(m[2] for m in micro)
    units = sum(m[3] for m in micro)
    real = sum(m[4] if len(m) > 4 else m[3] for m in micro)
    n_vals = sum(len(k) for k in keys)
    host = torch.tensor(ids + [i * i for i in ids] + [examples, units, n_vals, real],
                        dtype=torch.float64)
    device = values[0].device
    if device.type == "cuda":    # pinned, so that the copy need not wait for the host
        host = host.pin_memory()
    vec = torch.cat([torch.stack(flags).double(), host.to(device, non_blocking=True),
                     torch.cat(values).double()])
    return vec, keys


def nonfinite_flag(vec: torch.Tensor, n_micro: int) -> torch.Tensor:
    """Non-zero (on the device) when a loss was not finite on some rank: from an all-reduced
    ``step_vector``."""
    return vec[:n_micro].sum()


def reduce_step(micro: list[tuple], task_ids: dict[str, int], world: int, rank: int,
                step: int) -> dict[str, Any]:
    """The step's one all-reduce (``step_vector``), read at once: raises when ranks drew
    differently or a loss is non-finite. Only ``*loss`` entries decide finiteness (an
    accuracy may be NaN on an empty batch: counted as 0)."""
    vec, keys = step_vector(micro, task_ids)
    dist.all_reduce(vec)
    return read_step(vec.tolist(), micro, keys, world, rank, step)   # a host sync


def read_step(g: list[float], micro: list[tuple], keys: list[list[str]], world: int,
              rank: int, step: int) -> dict[str, Any]:
    """The statistics from an all-reduced ``step_vector`` read into ``g``."""
    n = len(micro)
    n_vals = sum(len(k) for k in keys)
    nonfinite, id_sum, id_sq = g[:n], g[n:2 * n], g[2 * n:3 * n]
    ex, un, nv, re = g[3 * n:3 * n + 4]
    check_tasks([m[0] for m in micro], id_sum, id_sq, world, rank, step,
                outputs_agree=nv == world * n_vals)
    bad = [i for i, f in enumerate(nonfinite) if f > 0]
    if bad:
        i = bad[0]
        task, out = micro[i][0], micro[i][1]
        raise FloatingPointError(
            f"non-finite loss at step {step + 1}, micro-batch {i + 1}/{n}, task "
            f"{task!r} (rank {rank} local values "
            f"{ {k: float(v) for k, v in out.items()} }); set train.on_nonfinite=skip to "
            "drop such batches")
    sums: dict[str, float] = collections.defaultdict(float)
    counts: dict[str, int] = collections.defaultdict(int)
    flat = iter(g[3 * n + 4:3 * n + 4 + n_vals])
    loss_sum = 0.0
    for names in keys:
        for k in names:
            v = next(flat) / world
            sums[k] += v
            counts[k] += 1
            if k == "loss":
                loss_sum += v
    return {"examples": int(round(ex)), "input_units": int(round(un)),
            "real_units": float(re), "loss_sum": loss_sum,
            "means": {k: sums[k] / counts[k] for k in sums}}


def check_tasks(tasks: list[str], id_sum: list[float], id_sq: list[float], world: int,
                rank: int, step: int, outputs_agree: bool = True) -> None:
    """Σ id² · world = (Σ id)² over ranks iff every rank drew the same id."""
    same = all(s * s == world * q for s, q in zip(id_sum, id_sq))
    if not (same and outputs_agree):
        raise RuntimeError(
            f"ranks disagree at step {step + 1}: rank {rank} drew tasks "
            f"{tasks}, others differ (or returned other outputs). The task sampler must "
            "be seeded identically on every rank")


class ReportWindow:
    """Means and throughput over the steps since the last report: examples and input units
    per second, model FLOP/s and MFU (``peak`` per device, None when unknown) — counted on
    the padded rows the device computes (``mfu``) and on the real tokens alone
    (``mfu_real``: input units minus padding, the work that trains the model) — and the
    share of the time the loop waited for its next batch."""

    def __init__(self, peak: float | None = None, world: int = 1):
        self.peak, self.world = peak, world
        self.reset()

    def reset(self) -> None:
        self.t0 = time.perf_counter()
        self.sums: dict[str, float] = collections.defaultdict(float)
        self.counts: dict[str, int] = collections.defaultdict(int)
        self.examples = self.units = 0
        self.flops = self.flops_real = self.wait = 0.0
        self.last: dict[str, Any] = {}

    def add(self, record: dict[str, Any]) -> None:
        self.last = record
        self.examples += record["global_batch_examples"]
        self.units += record["global_batch_input_units"]
        self.flops += record.get("model_flops", 0.0)
        self.flops_real += record.get("model_flops_real", 0.0)
        self.wait += record.get("data_wait_s", 0.0)
        for k, v in record.items():
            if k not in BOOKKEEPING and isinstance(v, float) and math.isfinite(v):
                self.sums[k] += v
                self.counts[k] += 1

    def summary(self, state: TrainerState) -> dict[str, Any]:
        dt = max(time.perf_counter() - self.t0, 1e-9)
        out: dict[str, Any] = {k: self.sums[k] / self.counts[k] for k in self.sums}
        out.update(step=state.step, stage=state.stage, lr=self.last.get("lr", 0.0),
                   examples_per_s=self.examples / dt, input_units_per_s=self.units / dt,
                   examples_seen=state.examples_seen, input_units_seen=state.input_units_seen,
                   skipped_batches=state.skipped_batches, data_wait_share=self.wait / dt)
        if self.flops:
            out["model_tflops_per_s"] = self.flops / dt / 1e12
            out["model_tflops_per_s_real"] = self.flops_real / dt / 1e12
            if self.peak:   # no "mfu" key when the device's peak is unknown (a CPU)
                out["mfu"] = self.flops / dt / (self.peak * self.world)
                out["mfu_real"] = self.flops_real / dt / (self.peak * self.world)
        return out
