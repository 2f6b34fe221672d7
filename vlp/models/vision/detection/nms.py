"""Greedy non-maximum suppression in plain torch, the same on CPU and GPU.

torchvision's compiled ``nms`` cannot be used here (the registry's torchvision is a CUDA
build that does not load beside the CPU torch this project installs), so greedy NMS is
written as a fixed point over the suppression matrix instead of a sequential scan:

    keep[i] = not any(keep[j] and IoU(j, i) > t  for j ranked above i)

The system is triangular (box i depends only on higher-ranked boxes), so iterating
``keep ← ¬(Sᵀ keep)`` from all-true reaches its unique solution, which is exactly the
greedy scan's result, after at most as many rounds as the longest chain of suppressions
(a handful in practice, not the number of boxes). Each round is one matrix-wide op on the
device; the only host syncs are the per-round convergence test and the final count, which
any NMS with a data-dependent output size has.

Ties in score are broken by input order (a stable sort), so results are deterministic.
"""

from __future__ import annotations

import torch


def box_area(boxes: torch.Tensor) -> torch.Tensor:
    return (boxes[:, 2] - boxes[:, 0]).clamp(min=0) * (boxes[:, 3] - boxes[:, 1]).clamp(min=0)


def box_iou(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """(N, 4) × (M, 4) x1y1x2y2 → (N, M) IoU; 0 where both boxes are empty."""
    lt = torch.maximum(a[:, None, :2], b[None, :, :2])
    rb = torch.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = (rb - lt).clamp(min=0).prod(dim=2)
    union = box_area(a)[:, None] + box_area(b)[None, :] - inter
    return torch.where(union > 0, inter / union.clamp(min=1e-12), torch.zeros_like(inter))


def greedy_keep(suppresses: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
    """Greedy NMS's keep mask from a suppression matrix in rank order.

    ``suppresses[..., j, i]`` is True when box j (ranked above i, so j < i) would suppress
    box i; leading dimensions are independent problems (one per class, say). ``valid``
    (``[..., N]``) marks boxes that take part at all. Returns the ``[..., N]`` keep mask.
    """
    n = suppresses.shape[-1]
    upper = torch.ones(n, n, dtype=torch.bool, device=suppresses.device).triu(1)
    sup = suppresses & upper
    if valid is not None:
        sup = sup & valid[..., :, None]
        keep = valid.clone()
    else:
        keep = torch.ones(sup.shape[:-1], dtype=torch.bool, device=sup.device)
    for _ in range(n + 1):          # converges in ≤ n rounds (triangular system)
        suppressed = (sup & keep[..., :, None]).any(dim=-2)
        new = ~suppressed if valid is None else valid & ~suppressed
        if torch.equal(new, keep):
            return keep
        keep = new
    raise AssertionError("greedy NMS fixed point did not converge")   # unreachable


def nms(boxes: torch.Tensor, scores: torch.Tensor, iou_threshold: float,
        max_keep: int | None = None) -> torch.Tensor:
    """Indices of the boxes greedy NMS keeps, highest score first (torchvision's contract).

    With ``max_keep``, only the first ``max_keep`` kept are returned, and the suppression
    matrix is built over a growing prefix of the ranked boxes: a box's fate depends only on
    boxes ranked above it, so once a prefix keeps ``max_keep`` boxes the rest cannot change
    the answer (RPN: 6000 candidates, 300 kept, usually decided within the first ~1000).
    """
    if boxes.shape[0] == 0:
        return torch.zeros(0, dtype=torch.long, device=boxes.device)
    order = torch.sort(scores, descending=True, stable=True).indices
    ranked = boxes[order].float()
    n = ranked.shape[0]
    prefix = n if max_keep is None else min(n, max(4 * max_keep, 256))
    while True:
        part = ranked[:prefix]
        keep = greedy_keep(box_iou(part, part) > iou_threshold)
        kept = order[:prefix][keep]
        if max_keep is None or prefix == n or kept.shape[0] >= max_keep:
            return kept if max_keep is None else kept[:max_keep]
        prefix = min(n, prefix * 4)


def batched_nms(boxes: torch.Tensor, scores: torch.Tensor, groups: torch.Tensor,
                iou_threshold: float, max_keep: int | None = None) -> torch.Tensor:
    """NMS within each group (class, image) independently, in one pass: boxes of different
    groups are moved apart by more than any box's extent so they never overlap."""
    if boxes.shape[0] == 0:
        return torch.zeros(0, dtype=torch.long, device=boxes.device)
    span = boxes.max() - boxes.min() + 1
    shifted = boxes + (groups.to(boxes.dtype) * span)[:, None]
    return nms(shifted, scores, iou_threshold, max_keep)


def classwise_keep(boxes: torch.Tensor, scores: torch.Tensor, iou_threshold: float,
                   valid: torch.Tensor | None = None, max_elements: int = 1 << 23
                   ) -> torch.Tensor:
    """Per-class greedy NMS when every class scores the same R boxes (Fast R-CNN's
    unregressed RoIs): ``scores`` (R, C) → keep mask (R, C).

    The IoU matrix is computed once and shared; classes are solved together in chunks whose
    (classes, K, K) suppression tensor stays under ``max_elements``. ``valid`` (R, C) leaves
    entries out entirely; an entry's fate depends only on higher-scored entries of its
    class, so leaving out every entry below a floor does not change the fate of those above
    it — and then only each class's K valid entries (its top K by score) take part.
    """
    r, c = scores.shape
    keep = torch.zeros(r, c, dtype=torch.bool, device=scores.device)
    if r == 0 or c == 0:
        return keep
    over = box_iou(boxes.float(), boxes.float()) > iou_threshold           # (R, R)
    counts = torch.full((c,), r, device=scores.device) if valid is None else valid.sum(0)
    by_count = torch.sort(counts, descending=True, stable=True).indices
    sizes = counts[by_count].tolist()                       # chunking is planned on the host
    start = 0
    while start < c and sizes[start] > 0:
        k = sizes[start]                                    # the chunk's largest class
        width = max(1, min(c - start, max_elements // (k * k)))
        cls = by_count[start:start + width]
        s = scores[:, cls].t()                                              # (c', R)
        order = torch.sort(s, dim=1, descending=True, stable=True).indices[:, :k]
        sup = over[order[:, :, None], order[:, None, :]]                    # (c', K, K)
        v = None if valid is None else torch.gather(valid[:, cls].t(), 1, order)
        kept_ranked = greedy_keep(sup, v)
        kept = torch.zeros(cls.shape[0], r, dtype=torch.bool, device=scores.device)
        kept.scatter_(1, order, kept_ranked)
        keep[:, cls] = kept.t()
        start += width
    return keep
