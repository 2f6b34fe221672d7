"""Dense peak FLOP/s of accelerators, by the exact name ``torch.cuda.get_device_name`` gives.

Exact names, not substrings: an A10G is not an A10 and an H100 PCIe is not an H100 SXM, and a
substring match would give each the other's peak. Figures are NVIDIA's datasheet dense
(no sparsity) tensor-core peaks, except the one row that says otherwise; TF32 is half the
16-bit peak on these architectures. A name not in the table has no known peak: MFU is then
reported as unknown unless ``train.peak_tflops`` (or a benchmark's ``--peak-tflops``) gives
it. CPUs have no entry.
"""

from __future__ import annotations

import torch

# bf16 / fp16 dense tensor-core TFLOP/s per device
PEAK_16BIT_TFLOPS: dict[str, float] = {
    "NVIDIA H100 80GB HBM3": 989.4,      # H100 SXM5
    "NVIDIA H100 PCIe": 756.0,
    "NVIDIA H200": 989.4,                # H200 SXM
    "NVIDIA A100-SXM4-40GB": 312.0,
    "NVIDIA A100-SXM4-80GB": 312.0,
    "NVIDIA A100-PCIE-40GB": 312.0,
    "NVIDIA A100 80GB PCIe": 312.0,
    "NVIDIA A10": 125.0,                 # not the A10G
    # AWS's A10G (g5): no NVIDIA datasheet; 70 is the dense bf16 figure AWS-side tables give
    # (unverified here: a run on one can override it with train.peak_tflops)
    "NVIDIA A10G": 70.0,
    "NVIDIA L4": 121.0,
    "NVIDIA L40S": 362.05,
    "NVIDIA L40": 181.05,
}


def peak_flops(device_name: str | None, precision: str, configured_tflops: float = 0.0
               ) -> float | None:
    """Peak FLOP/s of one device for ``precision`` (fp32 runs on TF32 tensor cores), or None
    when unknown. ``configured_tflops`` > 0 wins over the table."""
    if configured_tflops > 0:
        return configured_tflops * 1e12
    if not device_name or device_name not in PEAK_16BIT_TFLOPS:
        return None
    peak = PEAK_16BIT_TFLOPS[device_name] * 1e12
    return peak / 2 if precision == "fp32" else peak


def device_name(device: torch.device) -> str | None:
    """The CUDA device's name, None for anything else (no peak is invented for a CPU)."""
    if device.type != "cuda":
        return None
    return torch.cuda.get_device_name(device)
