"""Whether this CPU trains in fp16, as DeepSpeed's CPU accelerator decides, and the one-line
refusal where it does not.

DeepSpeed's CPU accelerator reports fp16 when oneDNN has fp16 kernels for the CPU
(``torch.ops.mkldnn._is_mkldnn_fp16_supported()``: AVX512-FP16 or AMX-FP16) and otherwise
refuses an fp16 engine deep inside ``deepspeed.initialize`` ("Type fp16 is not supported on
your device"), after the model is built. bf16 it always accepts (torch emulates it where
the CPU lacks AVX512-BF16/AMX).

oneDNN reads the CPU's flags, not ``ATEN_CPU_CAPABILITY``: a run that asks torch for its
AVX2 (or default) kernels would still get fp16 from DeepSpeed on an fp16-capable CPU. We
count fp16 absent there, so that such a run behaves as on the CPU those kernels stand for
(an AVX2-only CPU has no fp16), and a suite run under ``ATEN_CPU_CAPABILITY=avx2`` takes the
refusal path.
"""

from __future__ import annotations

import torch

from vlp.platform.training.deepspeed_import import load_deepspeed

# torch's CPU kernel levels below AVX-512 (``torch.backends.cpu.get_cpu_capability()``)
BELOW_AVX512 = ("DEFAULT", "AVX2", "NO AVX")


def cpu_fp16_supported() -> bool:
    """DeepSpeed's CPU accelerator's answer, absent where torch runs below AVX-512 kernels."""
    if torch.backends.cpu.get_cpu_capability() in BELOW_AVX512:
        return False
    load_deepspeed()   # before any deepspeed import: deepspeed_import.py
    from deepspeed.accelerator.cpu_accelerator import CPU_Accelerator

    return bool(CPU_Accelerator().is_fp16_supported())


def check_cpu_precision(precision: str) -> None:
    """Refuse fp16 on a CPU without fp16 kernels in one line, before DeepSpeed does so
    after the model is built."""
    if precision == "fp16" and not cpu_fp16_supported():
        raise ValueError(
            f"train.precision=fp16 on this CPU: DeepSpeed's CPU accelerator has no fp16 "
            f"(needs oneDNN fp16 kernels: AVX512-FP16 or AMX-FP16; torch's CPU kernels here: "
            f"{torch.backends.cpu.get_cpu_capability()}); use bf16 or fp32")
