"""The ResNet's BatchNorm keeps fp32 statistics beside bf16/fp16 parameters and inputs."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from vlp.models.vision.batch_norm import Fp32StatsBatchNorm2d


def pair(momentum=0.1):
    torch.manual_seed(0)
    ref, bn = nn.BatchNorm2d(6, momentum=momentum), Fp32StatsBatchNorm2d(6, momentum=momentum)
    with torch.no_grad():
        ref.weight.uniform_(0.5, 1.5)
        ref.bias.uniform_(-0.5, 0.5)
    bn.load_state_dict(ref.state_dict())
    return ref, bn


@pytest.mark.parametrize("momentum", [0.1, None])
def test_matches_torch_batchnorm_in_fp32(momentum):
    ref, bn = pair(momentum)
    for step in range(3):
        x = torch.randn(4, 6, 5, 5) * 3 + step
        torch.testing.assert_close(bn(x), ref(x), rtol=0, atol=0)
    for name, value in ref.state_dict().items():
        torch.testing.assert_close(bn.state_dict()[name], value, rtol=0, atol=0)
    ref.eval()
    bn.eval()
    x = torch.randn(2, 6, 5, 5)
    torch.testing.assert_close(bn(x), ref(x), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_parameters_keep_fp32_statistics(dtype):
    ref, bn = pair()
    bn.to(dtype)              # a whole-module cast as well as DeepSpeed's parameter-only one
    assert bn.weight.dtype == dtype and bn.running_var.dtype == torch.float32
    assert bn.num_batches_tracked.dtype == torch.long
    x = torch.randn(4, 6, 5, 5) * 3 + 1
    y = bn(x.to(dtype).requires_grad_())
    y.float().square().sum().backward()
    assert y.dtype == dtype and bn.weight.grad.dtype == dtype
    torch.testing.assert_close(y.float(), ref(x), rtol=0.02, atol=0.05)
    # the statistics were accumulated in fp32 from the low-precision input
    torch.testing.assert_close(bn.running_mean, ref.running_mean, rtol=0.01, atol=1e-3)
    torch.testing.assert_close(bn.running_var, ref.running_var, rtol=0.01, atol=1e-3)
    bn.eval()
    assert bn(x.to(dtype)).dtype == dtype


def test_parameter_only_cast_as_deepspeed_does():
    _, bn = pair()
    for p in bn.parameters():     # DeepSpeed 0.19: parameters cast, buffers left alone
        p.data = p.data.to(torch.bfloat16)
    y = bn(torch.randn(4, 6, 5, 5, dtype=torch.bfloat16))
    assert y.dtype == torch.bfloat16 and torch.isfinite(y.float()).all()
