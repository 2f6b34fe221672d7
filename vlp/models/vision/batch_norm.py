"""BatchNorm whose running statistics stay fp32 in a bf16/fp16 model.

Under DeepSpeed's bf16/fp16 modes the engine casts every parameter to the compute dtype but
leaves buffers alone, so a plain ``nn.BatchNorm2d`` ends up with bf16 weight/bias beside
fp32 running statistics, which ``F.batch_norm`` rejects. This layer makes the dtypes
consistent by construction, the way torch's AMP runs BatchNorm in a low-precision network:
the input stays in the compute dtype, the affine parameters are read as fp32 and the
statistics are kept, accumulated and used in fp32 (the kernels' mixed-type path, on CUDA
and CPU). The statistics are kept fp32 rather than cast down because a bf16 running
variance carries 8 significant bits, so the small momentum-0.1 updates of a settled
statistic round away (and fp16 can overflow it); the output comes back in the input's dtype.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Fp32StatsBatchNorm2d(nn.BatchNorm2d):
    """``nn.BatchNorm2d`` (same parameters, buffers and state-dict keys) whose floating
    buffers are fp32 whatever the module is cast to and whose parameters enter the kernel
    as fp32, so the module runs with bf16/fp16 or fp32 parameters and inputs alike."""

    def _apply(self, fn, recurse=True):
        # ``model.to(torch.bfloat16)``, ``.half()`` … cast the buffers too: take them back
        # to fp32 (device moves are kept)
        super()._apply(fn, recurse)
        for name, buf in self._buffers.items():
            if buf is not None and buf.is_floating_point() and buf.dtype != torch.float32:
                self._buffers[name] = buf.float()
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(x)
        # nn.BatchNorm2d's own bookkeeping (momentum None = cumulative average)
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:
                factor = 1.0 / float(self.num_batches_tracked)
        use_batch_stats = self.training or (self.running_mean is None
                                            and self.running_var is None)
        track = not self.training or self.track_running_stats
        weight = None if self.weight is None else self.weight.float()
        bias = None if self.bias is None else self.bias.float()
        return F.batch_norm(x, self.running_mean if track else None,
                            self.running_var if track else None, weight, bias,
                            use_batch_stats, factor, self.eps)
