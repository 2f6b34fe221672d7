"""The ResNet of a detectron2 C4 detector, in detectron2's parameter layout (so the public
BUTD weights load key by key): ``stem.conv1``, ``res2.0.conv1`` … ``res4.22.conv3``, each
conv followed by a frozen BatchNorm stored under ``<conv>.norm``, projection shortcuts
under ``shortcut``.

This differs from ``vlp/models/vision/resnet.py`` (torchvision's layout, stride in the 3×3,
trainable BatchNorm) in exactly the ways the Caffe-trained BUTD model needs: the stride of
a downsampling block sits in its first 1×1 conv (MSRA's original ResNet, "stride_in_1x1"),
BatchNorm is a fixed affine map, and the stem's max-pool is Caffe's (no padding, ceil
mode: the "caffemaxpool" of py-bottom-up-attention's configuration). res5 is built
separately as the RoI head, with stride 1 and dilation 2 (the BUTD test network's res5).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


class FrozenBatchNorm2d(nn.Module):
    """BatchNorm with fixed statistics and affine parameters, all buffers (detectron2's
    FrozenBatchNorm2d, same state-dict keys): y = (x - mean) / sqrt(var + eps) · w + b."""

    def __init__(self, channels: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.register_buffer("weight", torch.ones(channels))
        self.register_buffer("bias", torch.zeros(channels))
        self.register_buffer("running_mean", torch.zeros(channels))
        self.register_buffer("running_var", torch.ones(channels) - eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = self.weight * (self.running_var + self.eps).rsqrt()
        shift = self.bias - self.running_mean * scale
        return x * scale.to(x.dtype)[None, :, None, None] + shift.to(x.dtype)[None, :, None, None]


class ConvNorm(nn.Conv2d):
    """A bias-free conv whose frozen BatchNorm lives under ``.norm`` (detectron2's Conv2d)."""

    def __init__(self, cin: int, cout: int, kernel: int, stride: int = 1, padding: int = 0,
                 dilation: int = 1):
        super().__init__(cin, cout, kernel, stride=stride, padding=padding,
                         dilation=dilation, bias=False)
        self.norm = FrozenBatchNorm2d(cout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(super().forward(x))


class Bottleneck(nn.Module):
    def __init__(self, cin: int, width: int, cout: int, stride: int, dilation: int = 1):
        super().__init__()
        self.shortcut = ConvNorm(cin, cout, 1, stride=stride) if (cin != cout or stride != 1) \
            else None
        self.conv1 = ConvNorm(cin, width, 1, stride=stride)          # stride in the 1×1
        self.conv2 = ConvNorm(width, width, 3, padding=dilation, dilation=dilation)
        self.conv3 = ConvNorm(width, cout, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.shortcut is None else self.shortcut(x)
        out = F.relu_(self.conv1(x))
        out = F.relu_(self.conv2(out))
        return F.relu_(self.conv3(out) + identity)


def make_stage(blocks: int, cin: int, width: int, cout: int, first_stride: int,
               dilation: int = 1) -> nn.Sequential:
    layers = [Bottleneck(cin, width, cout, first_stride, dilation)]
    layers += [Bottleneck(cout, width, cout, 1, dilation) for _ in range(1, blocks)]
    return nn.Sequential(*layers)


@dataclass(frozen=True)
class C4Shape:
    """Widths and depths: ResNet-101 is stem 64, res2 out 256 (bottleneck 64), blocks
    3/4/23 + res5's 3."""
    stem: int
    res2_out: int
    res2_width: int
    blocks: tuple[int, int, int]
    res5_blocks: int

    @property
    def c4_channels(self) -> int:
        return self.res2_out * 4

    @property
    def res5_channels(self) -> int:
        return self.res2_out * 8


class Stem(nn.Module):
    def __init__(self, cout: int):
        super().__init__()
        self.conv1 = ConvNorm(3, cout, 7, stride=2, padding=3)
        # Caffe's pooling: no padding, output size rounded up (a module, no parameters: a
        # padded batch masks its input like a conv's, padded_batch.py)
        self.pool = nn.MaxPool2d(kernel_size=3, stride=2, padding=0, ceil_mode=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(F.relu_(self.conv1(x)))


class ResNetC4(nn.Module):
    """[B, 3, H, W] → C4 map [B, 4·res2_out, ~H/16, ~W/16] (keys stem, res2, res3, res4)."""

    stride = 16

    def __init__(self, shape: C4Shape):
        super().__init__()
        w, o = shape.res2_width, shape.res2_out
        self.stem = Stem(shape.stem)
        self.res2 = make_stage(shape.blocks[0], shape.stem, w, o, 1)
        self.res3 = make_stage(shape.blocks[1], o, w * 2, o * 2, 2)
        self.res4 = make_stage(shape.blocks[2], o * 2, w * 4, o * 4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.res4(self.res3(self.res2(self.stem(x))))


def res5_head(shape: C4Shape) -> nn.Sequential:
    """res5 as BUTD's RoI head: stride 1 and dilation 2 (14×14 RoI in, 14×14 out)."""
    o, w = shape.res2_out, shape.res2_width
    return make_stage(shape.res5_blocks, o * 4, w * 8, o * 8, first_stride=1, dilation=2)


def init_random(module: nn.Module) -> None:
    """Random weights that keep activations in range through 30+ blocks: He init for convs,
    and the last BatchNorm of each residual branch scaled down so the sum stays near the
    shortcut (a random 101-layer net otherwise grows past fp16's range)."""
    for m in module.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
        if isinstance(m, Bottleneck):
            m.conv3.norm.weight.fill_(0.1)
