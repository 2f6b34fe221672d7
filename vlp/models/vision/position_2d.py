"""DETR-style 2-D sine position embedding for SOHO's visual tokens."""

from __future__ import annotations

import math

import torch


def sine_position_2d(mask: torch.Tensor, dim: int, temperature: float = 10000.0) -> torch.Tensor:
    """``mask`` bool [I, h, w] (True = real cell) → [I, h, w, dim]: half the channels encode y,
    half x, each as interleaved sin/cos of the cell's normalised cumulative coordinate
    (normalised over the real cells, so padding does not shift an image's positions)."""
    if dim % 4:
        raise ValueError(f"2-D sine positions need a width divisible by 4, got {dim}")
    per_axis = dim // 2
    m = mask.float()
    y = m.cumsum(1)
    x = m.cumsum(2)
    eps, scale = 1e-6, 2 * math.pi
    y = y / (y[:, -1:, :] + eps) * scale
    x = x / (x[:, :, -1:] + eps) * scale
    steps = torch.arange(per_axis, device=mask.device, dtype=torch.float32)
    freq = temperature ** (2 * torch.div(steps, 2, rounding_mode="floor") / per_axis)
    px, py = x.unsqueeze(-1) / freq, y.unsqueeze(-1) / freq
    px = torch.stack([px[..., 0::2].sin(), px[..., 1::2].cos()], dim=-1).flatten(-2)
    py = torch.stack([py[..., 0::2].sin(), py[..., 1::2].cos()], dim=-1).flatten(-2)
    return torch.cat([py, px], dim=-1)
