"""Images of different sizes in one forward: one zero-padded canvas per batch, each spatial
op's input masked to every image's own extent, so each image gets the features it gets alone.

Zero padding after normalisation equals a convolution's own zero padding, but only for the
first one: after a BatchNorm shift or a bias the padded area is no longer zero, and the next
3×3 conv (or pool) would read it at the image's bottom and right border, where the same image
run alone reads the conv's zero padding. So every op that mixes positions (a conv with a
kernel or padding, a pool) has its input zeroed outside each image's extent at that
resolution. Pointwise ops (1×1 stride-1 convs, BatchNorm, ReLU, residual sums) never read a
neighbour and need no mask; a strided 1×1 conv reads only positions inside the extent.

Max pools see zeros where the image alone sees its padding (-inf, or nothing in Caffe's ceil
mode): equal because every max pool in these trunks follows a ReLU (inputs ≥ 0).
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Callable, Iterable, Iterator

import torch
from torch import nn

SIZE_DIVISOR = 32     # canvas sides: a multiple of the trunks' total stride

Extent = tuple[int, int]


def orientation_groups(images: list[torch.Tensor]) -> list[list[int]]:
    """Indices of a batch's landscape (and square) images, then its portrait ones: each group
    is one canvas. BUTD's resize puts a landscape image at 600 × up to 1000 and a portrait
    one at up to 1000 × 600, so one canvas for both would be 1000 × 1000, half of it
    padding; two canvases of one orientation each pad only the long sides' differences."""
    wide = [i for i, x in enumerate(images) if x.shape[1] >= x.shape[0]]
    tall = [i for i, x in enumerate(images) if x.shape[1] < x.shape[0]]
    return [g for g in (wide, tall) if g]


def canvas(images: list[torch.Tensor], normalise: Callable[[torch.Tensor], torch.Tensor],
           divisor: int = SIZE_DIVISOR) -> tuple[torch.Tensor, list[Extent]]:
    """uint8 HWC images (on the model's device) → ((B, 3, H, W) float32 canvas, their (h, w)).

    Each image is normalised first and then placed top-left, so the padding is 0 in the
    model's input space (the convolutions' own padding value), not the colour 0."""
    sizes = [(int(x.shape[0]), int(x.shape[1])) for x in images]
    height = math.ceil(max(h for h, _ in sizes) / divisor) * divisor
    width = math.ceil(max(w for _, w in sizes) / divisor) * divisor
    out = torch.zeros((len(images), 3, height, width), dtype=torch.float32,
                      device=images[0].device)
    for i, (x, (h, w)) in enumerate(zip(images, sizes)):
        out[i, :, :h, :w] = normalise(x)
    return out, sizes


def _pair(v) -> tuple[int, int]:
    return (v, v) if isinstance(v, int) else (int(v[0]), int(v[1]))


def _out_len(n: int, k: int, s: int, p: int, d: int, ceil_mode: bool) -> int:
    """PyTorch's output length of a conv / pool over ``n`` valid input positions."""
    span = n + 2 * p - d * (k - 1) - 1
    out = (-(-span // s) if ceil_mode else span // s) + 1
    if ceil_mode and (out - 1) * s >= n + p:   # the last window must start inside
        out -= 1
    return max(out, 1)


def _mixes_positions(m: nn.Module) -> bool:
    if isinstance(m, nn.Conv2d):
        return _pair(m.kernel_size) != (1, 1) or _pair(m.padding) != (0, 0)
    return True


class Extents:
    """Each image's (h, w) extent at every resolution of the traced modules, keyed by the
    canvas' spatial size there (one resolution, one canvas size, in these trunks)."""

    def __init__(self, sizes: list[Extent], canvas_hw: Extent):
        self.by_shape: dict[Extent, list[Extent]] = {tuple(canvas_hw): list(sizes)}
        self._masks: dict[Extent, torch.Tensor] = {}

    def at(self, x: torch.Tensor) -> list[Extent]:
        return self.by_shape[tuple(x.shape[-2:])]

    def masked(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` with every image's positions outside its extent set to 0."""
        hw = tuple(x.shape[-2:])
        extents = self.by_shape[hw]
        if all(e == hw for e in extents):
            return x
        mask = self._masks.get(hw)
        if mask is None:
            mask = torch.zeros((len(extents), 1, *hw), dtype=torch.bool, device=x.device)
            for i, (h, w) in enumerate(extents):
                mask[i, :, :h, :w] = True
            self._masks[hw] = mask
        return x * mask.to(x.dtype)

    def _pre(self, module: nn.Module, args: tuple) -> tuple | None:
        if _mixes_positions(module):
            return (self.masked(args[0]), *args[1:])
        return None

    def _post(self, module: nn.Module, args: tuple, out: torch.Tensor) -> None:
        k, s, p = (_pair(module.kernel_size), _pair(module.stride), _pair(module.padding))
        d = _pair(getattr(module, "dilation", 1))
        ceil_mode = bool(getattr(module, "ceil_mode", False))
        extents = [(_out_len(h, k[0], s[0], p[0], d[0], ceil_mode),
                    _out_len(w, k[1], s[1], p[1], d[1], ceil_mode)) for h, w in self.at(args[0])]
        hw = tuple(out.shape[-2:])
        known = self.by_shape.setdefault(hw, extents)
        if known != extents:
            raise RuntimeError(f"padded batch: two layers give a {hw} map different extents "
                               f"({known} and {extents}); this trunk cannot be masked by shape")


@contextmanager
def masked_extents(modules: Iterable[nn.Module], sizes: list[Extent], canvas_hw: Extent
                   ) -> Iterator[Extents]:
    """While open, every Conv2d / MaxPool2d / AvgPool2d below ``modules`` masks its input to
    each image's extent and records its output's extents (``Extents.at``)."""
    extents = Extents(sizes, canvas_hw)
    handles = []
    for root in modules:
        for m in root.modules():
            if isinstance(m, (nn.Conv2d, nn.MaxPool2d, nn.AvgPool2d)):
                handles.append(m.register_forward_pre_hook(extents._pre))
                handles.append(m.register_forward_hook(extents._post))
    try:
        yield extents
    finally:
        for h in handles:
            h.remove()
