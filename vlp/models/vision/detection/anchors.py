"""Anchors of a single-level RPN, in detectron2's layout (the one the public BUTD weights'
RPN head was converted to): cell anchors centred on 0 for every (size, aspect ratio), size
outer and ratio inner; tiled over the feature grid with the cell's top-left corner at
``offset × stride`` (offset 0, detectron2's default); flattened location-major, then
anchor, matching the RPN head's (A, H, W) outputs after a permute to (H, W, A)."""

from __future__ import annotations

import math

import torch


def cell_anchors(sizes: tuple[float, ...], aspect_ratios: tuple[float, ...]) -> torch.Tensor:
    """(len(sizes) × len(aspect_ratios), 4) boxes x1y1x2y2 around (0, 0); ratio = h / w."""
    out = []
    for size in sizes:
        area = float(size) ** 2
        for ratio in aspect_ratios:
            w = math.sqrt(area / ratio)
            h = ratio * w
            out.append([-w / 2.0, -h / 2.0, w / 2.0, h / 2.0])
    return torch.tensor(out, dtype=torch.float32)


def grid_anchors(cell: torch.Tensor, feat_h: int, feat_w: int, stride: int,
                 offset: float = 0.0) -> torch.Tensor:
    """(feat_h × feat_w × A, 4) anchors over the grid, row-major locations, anchor inner."""
    device = cell.device
    xs = (torch.arange(feat_w, device=device, dtype=torch.float32) + offset) * stride
    ys = (torch.arange(feat_h, device=device, dtype=torch.float32) + offset) * stride
    sy, sx = torch.meshgrid(ys, xs, indexing="ij")
    shifts = torch.stack([sx, sy, sx, sy], dim=-1).reshape(-1, 1, 4)
    return (shifts + cell[None]).reshape(-1, 4)
