"""ResNet-18/101 (and a tiny debug size) in plain torch, in torchvision's parameter layout.

Only the convolutional trunk (conv1 … layer4, output stride 32): SOHO pools and projects it
itself. Parameter names follow torchvision (``conv1``, ``bn1``, ``layer1.0.conv1``,
``layer1.0.downsample.0`` …) so ImageNet weights in that layout can be loaded by name where they
exist. Bottleneck blocks stride in the 3×3 conv (torchvision's "ResNet v1.5").
"""

from __future__ import annotations

import torch
from torch import nn

from vlp.models.vision.resnet_config import ResNetConfig
from vlp.models.vision.batch_norm import Fp32StatsBatchNorm2d

# fp32 statistics beside bf16/fp16 weights (DeepSpeed casts parameters, not buffers)
BatchNorm2d = Fp32StatsBatchNorm2d


def _conv3x3(cin: int, cout: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)


def _conv1x1(cin: int, cout: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(cin, cout, 1, stride=stride, bias=False)


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, cin: int, width: int, stride: int, downsample: nn.Module | None):
        super().__init__()
        self.conv1 = _conv3x3(cin, width, stride)
        self.bn1 = BatchNorm2d(width)
        self.conv2 = _conv3x3(width, width)
        self.bn2 = BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        return self.relu(self.bn2(self.conv2(out)) + identity)


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, cin: int, width: int, stride: int, downsample: nn.Module | None):
        super().__init__()
        self.conv1 = _conv1x1(cin, width)
        self.bn1 = BatchNorm2d(width)
        self.conv2 = _conv3x3(width, width, stride)
        self.bn2 = BatchNorm2d(width)
        self.conv3 = _conv1x1(width, width * self.expansion)
        self.bn3 = BatchNorm2d(width * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        return self.relu(self.bn3(self.conv3(out)) + identity)


BLOCKS: dict[str, type[BasicBlock] | type[Bottleneck]] = {"basic": BasicBlock,
                                                          "bottleneck": Bottleneck}


class ResNet(nn.Module):
    """[I, 3, H, W] → [I, out_channels, ⌈H/32⌉, ⌈W/32⌉]."""

    def __init__(self, cfg: ResNetConfig):
        super().__init__()
        block = BLOCKS[cfg.block]
        w = cfg.base_width
        self.conv1 = nn.Conv2d(3, w, 7, stride=2, padding=3, bias=False)
        self.bn1 = BatchNorm2d(w)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        self.cin = w
        self.layer1 = self._stage(block, w, cfg.layers[0], 1)
        self.layer2 = self._stage(block, w * 2, cfg.layers[1], 2)
        self.layer3 = self._stage(block, w * 4, cfg.layers[2], 2)
        self.layer4 = self._stage(block, w * 8, cfg.layers[3], 2)
        self.out_channels = cfg.out_channels
        self.reset_parameters()

    def _stage(self, block, width: int, blocks: int, stride: int) -> nn.Sequential:
        downsample = None
        if stride != 1 or self.cin != width * block.expansion:
            downsample = nn.Sequential(_conv1x1(self.cin, width * block.expansion, stride),
                                       BatchNorm2d(width * block.expansion))
        layers = [block(self.cin, width, stride, downsample)]
        self.cin = width * block.expansion
        layers += [block(self.cin, width, 1, None) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def reset_parameters(self) -> None:
        # The standard ResNet init (BERT's N(0, 0.02) would vanish the signal through 100 convs)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        return self.layer4(self.layer3(self.layer2(self.layer1(x))))
