"""RoIPool (Fast R-CNN's max pooling over quantised bins) in plain torch, with the
semantics of detectron2's / torchvision's ``ROIPool``: RoI corners rounded to map cells,
≥ 1-cell RoIs, bin p spanning ⌊p·bin⌋ … ⌈(p+1)·bin⌉ clipped to the map, empty bins 0.

The public BUTD weights were trained with it (the Caffe network's ``ROIPooling`` 14×14,
kept by py-bottom-up-attention's ``POOLER_TYPE: "ROIPool"``), so their features are
reproduced with it. Every bin is at most ``L = ⌈RoI side / output side⌉ + 1`` cells per
side; the bin's cells are gathered into a fixed (L × L) window per bin, past its end
repeating its last cell (max is unchanged by repeats), and reduced with one ``amax``.
"""

from __future__ import annotations

import torch


def _bins(start: torch.Tensor, end: torch.Tensor, out_size: int, size: int
          ) -> tuple[torch.Tensor, torch.Tensor]:
    """(K,) rounded RoI ends along one axis → (K, P, L) cell indices of each bin (last cell
    repeated past the bin's end) and the (K, P) mask of non-empty bins."""
    length = (end - start + 1).clamp(min=1).to(torch.float32)
    bin_len = length / out_size
    p = torch.arange(out_size, device=start.device, dtype=torch.float32)
    lo = torch.floor(p[None] * bin_len[:, None]).long() + start[:, None]
    hi = torch.ceil((p[None] + 1) * bin_len[:, None]).long() + start[:, None]
    lo, hi = lo.clamp(0, size), hi.clamp(0, size)
    span = int((hi - lo).max().item()) if lo.numel() else 1   # window size: one sync
    offsets = torch.arange(max(span, 1), device=start.device)
    cells = torch.minimum(lo[:, :, None] + offsets, (hi - 1).clamp(min=0)[:, :, None])
    return cells.clamp(max=size - 1), hi > lo


def roi_pool(features: torch.Tensor, rois: torch.Tensor, output_size: int,
             spatial_scale: float, max_elements: int = 1 << 26) -> torch.Tensor:
    """features (B, C, H, W), rois (K, 5) = (batch index, x1, y1, x2, y2) in input pixels
    → (K, C, output_size, output_size)."""
    b, c, h, w = features.shape
    k = rois.shape[0]
    out = features.new_zeros(k, c, output_size, output_size)
    if k == 0:
        return out
    scaled = rois[:, 1:].float() * spatial_scale
    # C's round(): halves away from zero (torch.round would take them to even)
    corners = (torch.sign(scaled) * torch.floor(scaled.abs() + 0.5)).long()
    rows, rows_ok = _bins(corners[:, 1], corners[:, 3], output_size, h)
    cols, cols_ok = _bins(corners[:, 0], corners[:, 2], output_size, w)
    filled = rows_ok[:, :, None] & cols_ok[:, None, :]                      # (K, P, P)
    image_of = rois[:, 0].long()
    per_roi = c * output_size ** 2 * rows.shape[2] * cols.shape[2]
    chunk = max(1, max_elements // per_roi)
    for image in range(b):
        idx = (image_of == image).nonzero().squeeze(1)
        fmap = features[image]
        for part in idx.split(chunk):
            r, q = rows[part], cols[part]                 # (k, P, Lh), (k, P, Lw)
            # (C, k, P, Lh, P, Lw): each bin's window of cells
            window = fmap[:, r[:, :, :, None, None], q[:, None, None, :, :]]
            pooled = window.amax(dim=(3, 5)).permute(1, 0, 2, 3)             # (k, C, P, P)
            out[part] = torch.where(filled[part][:, None], pooled, torch.zeros_like(pooled))
    return out
