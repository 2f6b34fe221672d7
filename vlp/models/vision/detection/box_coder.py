"""Box ↔ delta transform of Faster R-CNN (dx, dy, dw, dh relative to a reference box), in
detectron2's convention: widths are x2 - x1 (no "+1"), centres at x1 + w/2, per-coordinate
weights (RPN 1,1,1,1; Fast R-CNN head 10,10,5,5), dw/dh clamped at log(1000/16) before exp
so a wild prediction cannot overflow."""

from __future__ import annotations

import math

import torch

DEFAULT_SCALE_CLAMP = math.log(1000.0 / 16)


class BoxCoder:
    def __init__(self, weights: tuple[float, float, float, float] = (1.0, 1.0, 1.0, 1.0),
                 scale_clamp: float = DEFAULT_SCALE_CLAMP):
        self.weights = weights
        self.scale_clamp = scale_clamp

    def encode(self, reference: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Deltas that take ``reference`` (N, 4) boxes to ``target`` (N, 4) boxes."""
        wx, wy, ww, wh = self.weights
        rw = reference[:, 2] - reference[:, 0]
        rh = reference[:, 3] - reference[:, 1]
        rx = reference[:, 0] + 0.5 * rw
        ry = reference[:, 1] + 0.5 * rh
        tw = target[:, 2] - target[:, 0]
        th = target[:, 3] - target[:, 1]
        tx = target[:, 0] + 0.5 * tw
        ty = target[:, 1] + 0.5 * th
        return torch.stack([wx * (tx - rx) / rw, wy * (ty - ry) / rh,
                            ww * torch.log(tw / rw), wh * torch.log(th / rh)], dim=1)

    def decode(self, deltas: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
        """``deltas`` (N, 4k) applied to ``reference`` (N, 4) → boxes (N, 4k): k sets of
        deltas per reference box (one per class in the Fast R-CNN head)."""
        deltas = deltas.float()
        reference = reference.float()
        wx, wy, ww, wh = self.weights
        w = (reference[:, 2] - reference[:, 0])[:, None]
        h = (reference[:, 3] - reference[:, 1])[:, None]
        cx = reference[:, 0, None] + 0.5 * w
        cy = reference[:, 1, None] + 0.5 * h
        dx, dy = deltas[:, 0::4] / wx, deltas[:, 1::4] / wy
        dw = (deltas[:, 2::4] / ww).clamp(max=self.scale_clamp)
        dh = (deltas[:, 3::4] / wh).clamp(max=self.scale_clamp)
        pcx, pcy = dx * w + cx, dy * h + cy
        pw, ph = torch.exp(dw) * w, torch.exp(dh) * h
        out = torch.stack([pcx - 0.5 * pw, pcy - 0.5 * ph, pcx + 0.5 * pw, pcy + 0.5 * ph],
                          dim=2)
        return out.reshape(deltas.shape)


def clip_boxes(boxes: torch.Tensor, height: float, width: float) -> torch.Tensor:
    """x into [0, width], y into [0, height] (any number of boxes per row: (N, 4k))."""
    limits = torch.tensor([width, height], dtype=boxes.dtype, device=boxes.device)
    shaped = boxes.reshape(*boxes.shape[:-1], -1, 2)
    return torch.minimum(shaped.clamp(min=0), limits).reshape(boxes.shape)


def nonempty(boxes: torch.Tensor, min_side: float = 0.0) -> torch.Tensor:
    return ((boxes[:, 2] - boxes[:, 0]) > min_side) & ((boxes[:, 3] - boxes[:, 1]) > min_side)
