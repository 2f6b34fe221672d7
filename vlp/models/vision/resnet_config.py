"""The ResNet trunks' shapes (SOHO's pixel encoder, the grid extractors), in a module of their
own: the extractors and the ResNet build from these without importing the family configs
(and transformers' ``BertConfig`` with them) in every extraction actor. ``family_config``
re-exports them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ResNetConfig:
    """A torchvision-layout ResNet (so ImageNet weights in that layout load by name)."""

    block: str  # "basic" (ResNet-18/34) or "bottleneck" (ResNet-50/101/152)
    layers: tuple[int, int, int, int]
    base_width: int = 64

    def __post_init__(self) -> None:
        if self.block not in ("basic", "bottleneck"):
            raise ValueError(f"visual.resnet.block={self.block!r}: expected basic or bottleneck")

    @property
    def out_channels(self) -> int:
        return self.base_width * 8 * (4 if self.block == "bottleneck" else 1)


RESNET18 = ResNetConfig("basic", (2, 2, 2, 2))
RESNET101 = ResNetConfig("bottleneck", (3, 4, 23, 3))
RESNET_TINY = ResNetConfig("basic", (1, 1, 1, 1), base_width=8)
