"""Forward+backward throughput and peak memory of a model family, per task and for a task mix.

    python jobs/benchmarks/model_throughput.py                      # uniter-base, standard batch
    python jobs/benchmarks/model_throughput.py --family uniter-tiny --iters 5

Standard batch (UNITER pretraining scale): 32 pairs × 20 text tokens × 36 regions, D = 2048,
C = 1601, every text and image full length (1792 input units). One step = forward + backward
of one task's batch (no optimiser step). The mix is UNITER's in-domain itm:mlm:mrfr:mrc-kl =
2:2:1:1, run as a fixed 6-step cycle with those proportions (on CPU, where a base-size step
takes seconds, the mix figure is by default derived from the per-task steps as the 2:2:1:1
weighted mean step time — ``--mix-cycles N`` measures it). On CUDA it also runs bf16 autocast
and reports MFU against the GPU's dense peak (``vlp.platform.training.device_peaks``: exact device
names; ``--peak-tflops`` for others). The fp32 GEMM roofline — a large matmul on the same
device and threads, measured in the same run — gives each task's achieved encoder FLOP/s as
a fraction of what this machine's matrix multiply reaches (``<task>/fp32/roofline_frac``);
``encoder_gemm_frac`` divides by the FLOP/s of one encoder layer's own matmul shapes at this
batch instead (forward and both backward products of each Linear), the ceiling a step made
of those matmuls could reach.
On CPU, peak memory is the process's peak RSS sampled during the task (weights included); on
CUDA, ``max_memory_allocated``.

Prints a settings block, then one figure per line: ``<task>/<dtype>/<metric> <value>``. On
CPU it adds the process CPU time per step: on a shared machine, wall time includes waiting
for cores that other jobs hold, CPU time does not (divide by the thread count for a
contention-free wall-time estimate).
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time

import torch

from vlp.models import create_model
from vlp.testing.example_batches import example_batch
from vlp.models.flops import encoder_shape
from vlp.platform.training.device_peaks import peak_flops

MIX = {"itm": 2, "mlm": 2, "mrfr": 1, "mrc-kl": 1}  # UNITER in-domain mix
MIX_CYCLE = ("itm", "mlm", "mrfr", "itm", "mlm", "mrc-kl")
CPU_SECONDS = 0.0  # process CPU time of the last run_steps: on a shared CPU machine this is
                   # the contention-free cost, wall time also counts waiting for cores


class PeakRSS:
    """Peak resident memory of this process while the block runs (sampled every 2 ms)."""

    def __init__(self):
        import psutil
        self.process, self.peak, self._stop = psutil.Process(), 0, threading.Event()

    def __enter__(self):
        self.peak = self.process.memory_info().rss
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, self.process.memory_info().rss)
            time.sleep(0.002)

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def train_flops(model, batch_size: int, seq_len: int) -> float:
    """Encoder training FLOPs per step (``vlp.models.flops``, the formula the loop logs)."""
    return encoder_shape(model).train_flops(batch_size, batch_size * seq_len)


def matmul_flops_per_s(device, operands: list[tuple[torch.Tensor, torch.Tensor]],
                       reps: int) -> float:
    """FLOP/s of the products ``a @ b`` of ``operands`` run in turn, best of ``reps`` (after
    one warm-up pass)."""
    flops = sum(2 * a.shape[0] * a.shape[1] * b.shape[1] for a, b in operands)
    best = float("inf")
    for _ in range(reps + 1):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for a, b in operands:
            a @ b
        if device.type == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return flops / best


def gemm_roofline(device, n: int = 2048, reps: int = 5) -> float:
    """FLOP/s of an fp32 n×n×n matmul on this device and thread count (best of ``reps``)."""
    a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
    return matmul_flops_per_s(device, [(a, b)], reps)


def encoder_gemm_roofline(device, model, tokens: int, reps: int = 3) -> float:
    """FLOP/s of the matmuls one encoder layer's Linears make in a training step at ``tokens``
    rows (forward ``x @ W.T``, backward ``dy @ W`` and ``dy.T @ x``), fp32, best of ``reps``:
    what this machine's matrix multiply reaches on the model's own shapes, which at K = 768
    sits below a 2048³ product's."""
    layer = model.backbone.encoder.layer[0]
    shapes = [tuple(m.weight.shape) for m in layer.modules() if isinstance(m, torch.nn.Linear)]
    operands = []
    for out_f, in_f in shapes:
        x, w = torch.randn(tokens, in_f, device=device), torch.randn(out_f, in_f, device=device)
        dy = torch.randn(tokens, out_f, device=device)
        operands += [(x, w.t()), (dy, w), (dy.t(), x)]
    return matmul_flops_per_s(device, operands, reps)


def run_steps(model, batches, tasks, device, dtype) -> float:
    """Seconds for forward+backward of ``tasks`` in order (each with its own batch)."""
    if device.type == "cuda":
        torch.cuda.synchronize()
    global CPU_SECONDS
    cpu_start = time.process_time()
    start = time.perf_counter()
    for task in tasks:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=dtype == "bf16"):
            loss = model(batches[task], task=task)["loss"]
        loss.backward()
        model.zero_grad(set_to_none=True)
    if device.type == "cuda":
        torch.cuda.synchronize()
    CPU_SECONDS = time.process_time() - cpu_start
    return time.perf_counter() - start


def measure(model, batches, tasks, device, dtype, iters):
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
        seconds = run_steps(model, batches, tasks * iters, device, dtype)
        return seconds, torch.cuda.max_memory_allocated() / 2**20
    with PeakRSS() as rss:
        seconds = run_steps(model, batches, tasks * iters, device, dtype)
    return seconds, rss.peak / 2**20


class forced_sdpa:
    """SDPA for every call, also in CPU training with dropout (its math path there)."""

    def __enter__(self):
        from vlp.models.backbone import VLBackbone

        self.cls, self.auto = VLBackbone, VLBackbone._attention_for
        VLBackbone._attention_for = lambda backbone, x, configured: configured

    def __exit__(self, *exc):
        self.cls._attention_for = self.auto


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--family", default="uniter-base")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--text-len", type=int, default=20)
    p.add_argument("--regions", type=int, default=36)
    p.add_argument("--feat-dim", type=int, default=2048)
    p.add_argument("--classes", type=int, default=1601)
    p.add_argument("--iters", type=int, default=None, help="measured steps per task "
                   "(default 10 on CUDA, 1 on CPU)")
    p.add_argument("--warmup", type=int, default=None, help="unmeasured steps per task and "
                   "dtype after one global warm-up step (default 3 on CUDA, 0 on CPU)")
    p.add_argument("--mix-cycles", type=int, default=None, help="measured 6-step mix cycles "
                   "(default: iters on CUDA; 0 on CPU = derive from the per-task steps)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--no-mix", action="store_true")
    p.add_argument("--compare-sdpa", action="store_true", help="also time each task with "
                   "SDPA forced in CPU training (the attention before eager was chosen there), "
                   "interleaved with the default, and print the ratio")
    p.add_argument("--peak-tflops", type=float, default=0.0, help="the device's dense bf16 "
                   "peak when its name is not in vlp.platform.training.device_peaks")
    args = p.parse_args()

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cuda = device.type == "cuda"
    if args.threads:
        torch.set_num_threads(args.threads)
    iters = args.iters or (10 if cuda else 1)
    warmup = args.warmup if args.warmup is not None else (3 if cuda else 0)
    mix_cycles = args.mix_cycles if args.mix_cycles is not None else (iters if cuda else 0)
    torch.manual_seed(0)
    model, spec, _ = create_model(args.family, tasks=list(MIX), region_feat_dim=args.feat_dim,
                                  num_classes=args.classes)
    model.to(device).train()
    batches = {t: {k: v.to(device) for k, v in example_batch(
        spec, t, batch_size=args.batch, text_len=args.text_len, num_regions=args.regions,
        full_length=True).items()} for t in MIX}
    seq = args.text_len + (args.regions if spec.input_kind == "regions" else 0)
    units = args.batch * seq
    dtypes = ["fp32", "bf16"] if cuda else ["fp32"]
    gpu = torch.cuda.get_device_name() if cuda else None
    peak = peak_flops(gpu, "bf16", args.peak_tflops)

    print(f"# model_throughput: {args.family}, {model.num_parameters() / 1e6:.1f}M parameters "
          f"({model.num_parameters(exclude_word_embeddings=True) / 1e6:.1f}M without word "
          "embeddings)")
    print(f"# batch: {args.batch} pairs × {args.text_len} tokens × {args.regions} regions = "
          f"{units} input units; D={args.feat_dim} C={args.classes}; forward+backward, "
          "no optimiser step")
    print(f"# device: {gpu or 'cpu'}; torch {torch.__version__}; torch threads "
          f"{torch.get_num_threads()} (interop {torch.get_num_interop_threads()}), "
          f"os.cpu_count {os.cpu_count()}, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}"
          + (f", load average {os.getloadavg()[0]:.1f}" if not cuda else ""))
    print(f"# steps: 1 global warm-up, then {warmup} warm-up + {iters} measured per task and "
          f"dtype; mix: {f'{mix_cycles} measured 6-step cycles' if mix_cycles else 'derived'}; "
          f"attention {model.backbone.bert_config._attn_implementation}")
    flops = train_flops(model, args.batch, seq)
    print(f"encoder_train_tflop_per_step {flops / 1e12:.3f}")
    roofline = gemm_roofline(device)
    print(f"fp32_gemm_2048_gflops {roofline / 1e9:.1f}")
    shaped = encoder_gemm_roofline(device, model, units)
    print(f"fp32_gemm_encoder_shapes_gflops {shaped / 1e9:.1f}")

    run_steps(model, batches, ["itm"], device, dtypes[0])  # allocator / first-call costs
    for dtype in dtypes:
        steps, memories = {}, {}
        for task in MIX:
            run_steps(model, batches, [task] * warmup, device, dtype)
            seconds, memory = measure(model, batches, [task], device, dtype, iters)
            step = steps[task] = seconds / iters
            memories[task] = memory
            print(f"{task}/{dtype}/step_ms {step * 1e3:.1f}")
            if args.compare_sdpa and not cuda:
                with forced_sdpa():
                    sdpa_seconds, _ = measure(model, batches, [task], device, dtype, iters)
                again, _ = measure(model, batches, [task], device, dtype, iters)
                step = steps[task] = (seconds + again) / (2 * iters)   # before and after
                print(f"{task}/{dtype}/step_ms_default_mean {step * 1e3:.1f}")
                print(f"{task}/{dtype}/sdpa_step_ms {sdpa_seconds / iters * 1e3:.1f}")
                print(f"{task}/{dtype}/default_over_sdpa {step * iters / sdpa_seconds:.3f}")
            if not cuda:
                print(f"{task}/{dtype}/cpu_time_ms_per_step {CPU_SECONDS / iters * 1e3:.1f}")
            print(f"{task}/{dtype}/examples_per_s {args.batch / step:.2f}")
            print(f"{task}/{dtype}/input_units_per_s {units / step:.0f}")
            print(f"{task}/{dtype}/peak_mem_MiB {memory:.0f}")
            print(f"{task}/{dtype}/encoder_gflops {flops / step / 1e9:.1f}")
            if dtype == "fp32":
                print(f"{task}/{dtype}/roofline_frac {flops / step / roofline:.3f}")
                print(f"{task}/{dtype}/encoder_gemm_frac {flops / step / shaped:.3f}")
            if peak and dtype == "bf16":
                print(f"{task}/{dtype}/mfu_pct {100 * flops / step / peak:.1f}")
        if args.no_mix:
            continue
        if mix_cycles:
            seconds, memory = measure(model, batches, list(MIX_CYCLE), device, dtype,
                                      mix_cycles)
            step = seconds / (mix_cycles * len(MIX_CYCLE))
            name = "mix_itm2_mlm2_mrfr1_mrckl1"
        else:
            step = sum(MIX[t] * steps[t] for t in MIX) / sum(MIX.values())
            memory = max(memories.values())
            name = "mix_itm2_mlm2_mrfr1_mrckl1_derived"
        print(f"{name}/{dtype}/step_ms {step * 1e3:.1f}")
        print(f"{name}/{dtype}/examples_per_s {args.batch / step:.2f}")
        print(f"{name}/{dtype}/input_units_per_s {units / step:.0f}")
        print(f"{name}/{dtype}/peak_mem_MiB {memory:.0f}")
        if dtype == "fp32":
            print(f"{name}/{dtype}/roofline_frac {flops / step / roofline:.3f}")
            print(f"{name}/{dtype}/encoder_gemm_frac {flops / step / shaped:.3f}")
        if peak and dtype == "bf16":
            print(f"{name}/{dtype}/mfu_pct {100 * flops / step / peak:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
