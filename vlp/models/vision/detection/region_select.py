"""Which RoIs become an image's regions: the rule of BUTD's feature dump (bottom-up-attention
``tools/generate_tsv.py``), which UNITER's and LXMERT's features used.

For every object class (not background) greedy NMS runs over the RoIs (unregressed) scored
by that class; a RoI's confidence is its highest class score among the classes whose NMS
kept it. RoIs with confidence ≥ the threshold are regions, best first, at most
``max_boxes``; when fewer than ``min_boxes`` pass, the ``min_boxes`` most confident RoIs
are taken instead.

The per-class NMS is run only on the (RoI, class) entries at or above a floor: an entry's
fate depends only on higher-scored entries of its class, so every confidence at or above
the floor comes out exact (a softmax row has at most 1/floor such entries). The floor
starts at the threshold; when fewer than ``min_boxes`` RoIs pass, the fill-in ranks RoIs
by confidences below it, so the floor is lowered step by step until ``min_boxes`` RoIs
reach it (their ranking is then exact, and every other RoI is below all of them), down to
0 (the full problem: every class, every RoI) only when nothing else decides it.
"""

from __future__ import annotations

import torch

from vlp.models.vision.detection.nms import classwise_keep

# below this floor the remaining steps would cost about what the full problem costs
FULL_BELOW = 1e-3


def max_confidence(boxes: torch.Tensor, probs: torch.Tensor, nms_threshold: float,
                   floor: float) -> torch.Tensor:
    """(R,) confidence per RoI: exact where it is ≥ ``floor``, 0 otherwise. ``probs`` is
    (R, C) over object classes only (background dropped)."""
    valid = probs >= floor
    classes = valid.any(dim=0).nonzero().squeeze(1)        # classes anyone reaches
    conf = torch.zeros(probs.shape[0], dtype=probs.dtype, device=probs.device)
    if classes.numel() == 0:
        return conf
    sub, sub_valid = probs[:, classes], valid[:, classes]
    keep = classwise_keep(boxes, sub, nms_threshold, valid=sub_valid)
    return torch.where(keep, sub, torch.zeros_like(sub)).amax(dim=1)


def select_regions(boxes: torch.Tensor, probs: torch.Tensor, nms_threshold: float,
                   conf_threshold: float, min_boxes: int, max_boxes: int
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """(indices into the RoIs, their confidences), most confident first."""
    conf = max_confidence(boxes, probs, nms_threshold, conf_threshold)
    passed = int((conf >= conf_threshold).sum())            # the count decides: one sync
    floor, reached = conf_threshold, passed
    while reached < min(min_boxes, conf.shape[0]) and floor > 0:
        floor = floor / 4 if floor > FULL_BELOW else 0.0
        conf = max_confidence(boxes, probs, nms_threshold, floor)
        reached = int((conf >= floor).sum()) if floor > 0 else conf.shape[0]
    count = min(max(passed, min_boxes), max_boxes, conf.shape[0])
    order = torch.sort(conf, descending=True, stable=True).indices[:count]
    return order, conf[order]
