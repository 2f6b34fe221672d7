"""fp16 on CPU follows the hardware as DeepSpeed's CPU accelerator sees it, held absent where
torch runs below AVX-512 kernels (ATEN_CPU_CAPABILITY=avx2/default, as on an AVX2-only CPU),
and is refused in one line where absent. The engine path under both: test_soho_recipe_engine."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from vlp.platform.training.cpu_precision import (BELOW_AVX512, check_cpu_precision,
                                                 cpu_fp16_supported)


def test_follows_deepspeeds_cpu_accelerator_at_avx512_and_above():
    from deepspeed.accelerator.cpu_accelerator import CPU_Accelerator

    if torch.backends.cpu.get_cpu_capability() in BELOW_AVX512:
        assert not cpu_fp16_supported()
    else:      # DeepSpeed asks oneDNN whether the CPU has fp16 kernels
        assert cpu_fp16_supported() == bool(CPU_Accelerator().is_fp16_supported()) \
            == torch.ops.mkldnn._is_mkldnn_fp16_supported()


@pytest.mark.parametrize("capability", ["avx2", "default"])
def test_absent_when_torch_is_held_below_avx512(capability):
    code = ("import torch; from vlp.platform.training.cpu_precision import cpu_fp16_supported;"
            "print(torch.backends.cpu.get_cpu_capability(), cpu_fp16_supported())")
    env = {**os.environ, "ATEN_CPU_CAPABILITY": capability,
           "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, check=True).stdout.split()
    assert out == [{"avx2": "AVX2", "default": "DEFAULT"}[capability], "False"]


def test_refusal_is_one_line_naming_the_kernels():
    check_cpu_precision("bf16")
    check_cpu_precision("fp32")
    if cpu_fp16_supported():
        check_cpu_precision("fp16")
    else:
        with pytest.raises(ValueError) as e:
            check_cpu_precision("fp16")
        msg = str(e.value)
        assert "\n" not in msg and msg.startswith("train.precision=fp16 on this CPU")
        assert torch.backends.cpu.get_cpu_capability() in msg and "bf16" in msg
