"""RoIAlign in plain torch, with detectron2's ``ROIAlign`` semantics (``aligned`` True is
its ROIAlignV2: pixel centres at +0.5; False keeps the original's ≥ 1-cell RoIs), on CPU
and GPU.

Each output bin averages a grid of bilinear samples (``sampling_ratio`` per side, or
⌈RoI side / output side⌉ per RoI when 0). Bilinear sampling and the average are linear and
separable in y and x, so one output channel is ``Ay · F · Axᵀ``: ``Ay`` (P × H) holds, for
each output row, the averaged bilinear weights of its sample rows over the map's rows, and
``Ax`` likewise for columns. Two matrix products per RoI replace millions of gathers, and
the result is the same sum of the same terms (a sample outside the map, y < -1 or y > H,
weighs 0 in its factor, which zeroes its product as the reference kernel does).
"""

from __future__ import annotations

import torch


def _axis_weights(start: torch.Tensor, end: torch.Tensor, out_size: int, size: int,
                  sampling_ratio: int, aligned: bool) -> torch.Tensor:
    """(K,) RoI extents along one axis (feature-map units) → (K, out_size, size) weights:
    the mean over each bin's samples of their linear-interpolation weights."""
    length = end - start
    if not aligned:
        length = length.clamp(min=1.0)
    bin_len = length / out_size                                             # (K,)
    if sampling_ratio > 0:
        grid = torch.full_like(bin_len, float(sampling_ratio))
    else:
        # an empty RoI has no samples and pools to 0, as in the reference kernel
        grid = torch.ceil(length / out_size).clamp(min=0.0)
    g_max = max(1, int(grid.max().item()))   # the sample count is data-given: one sync
    k = start.shape[0]
    iy = torch.arange(g_max, device=start.device, dtype=start.dtype)
    ph = torch.arange(out_size, device=start.device, dtype=start.dtype)
    # sample coordinate of bin p, sample i: start + p·bin + (i + ½)·bin / grid
    y = (start[:, None, None] + ph[None, :, None] * bin_len[:, None, None]
         + (iy[None, None, :] + 0.5) * (bin_len / grid.clamp(min=1.0))[:, None, None])  # K,P,G
    used = (iy[None, None, :] < grid[:, None, None]).expand_as(y)
    inside = (y >= -1.0) & (y <= size)
    y = y.clamp(min=0.0)
    low = torch.floor(y).long()
    at_edge = low >= size - 1
    low = torch.where(at_edge, torch.full_like(low, size - 1), low)
    high = torch.where(at_edge, low, low + 1)
    frac = torch.where(at_edge, torch.zeros_like(y), y - low.to(y.dtype))
    scale = (used & inside).to(y.dtype) / grid.clamp(min=1.0)[:, None, None]
    weights = torch.zeros(k, out_size, size, device=start.device, dtype=start.dtype)
    weights.scatter_add_(2, low.reshape(k, out_size, -1),
                         ((1.0 - frac) * scale).reshape(k, out_size, -1))
    weights.scatter_add_(2, high.reshape(k, out_size, -1), (frac * scale).reshape(k, out_size, -1))
    return weights


def roi_align(features: torch.Tensor, rois: torch.Tensor, output_size: int,
              spatial_scale: float, sampling_ratio: int = 0, aligned: bool = True,
              max_elements: int = 1 << 26) -> torch.Tensor:
    """features (B, C, H, W), rois (K, 5) = (batch index, x1, y1, x2, y2) in input pixels
    → (K, C, output_size, output_size).

    RoIs are taken a chunk at a time so the (chunk, P, C, W) intermediate stays under
    ``max_elements`` elements.
    """
    b, c, h, w = features.shape
    k = rois.shape[0]
    out = features.new_zeros(k, c, output_size, output_size)
    if k == 0:
        return out
    offset = 0.5 if aligned else 0.0
    coords = rois[:, 1:].float() * spatial_scale - offset
    ay = _axis_weights(coords[:, 1], coords[:, 3], output_size, h, sampling_ratio, aligned)
    ax = _axis_weights(coords[:, 0], coords[:, 2], output_size, w, sampling_ratio, aligned)
    ay, ax = ay.to(features.dtype), ax.to(features.dtype)
    image_of = rois[:, 0].long()
    chunk = max(1, max_elements // max(1, output_size * c * w))
    for image in range(b):
        idx = (image_of == image).nonzero().squeeze(1)
        if idx.numel() == 0:
            continue
        flat = features[image].permute(1, 0, 2).reshape(h, c * w)             # (H, C·W)
        for part in idx.split(chunk):
            rows = (ay[part] @ flat).reshape(-1, output_size, c, w)         # (k, P, C, W)
            pooled = rows @ ax[part].transpose(1, 2)[:, None]                # (k, P, C, P)
            out[part] = pooled.permute(0, 2, 1, 3)
    return out
