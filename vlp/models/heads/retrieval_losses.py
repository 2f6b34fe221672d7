"""Retrieval finetuning losses over groups ``[positive, negatives…]`` of match scores.

- ``margin`` (UNITER): hinge with margin 0.2 between sigmoid(positive) and each
  sigmoid(negative), averaged over the negatives of all groups.
- ``bce`` (ImageBERT's best): binary cross-entropy on every pair, labels 1 / 0.
- ``mce`` (ImageBERT): cross-entropy over the P = 1 + negatives scores of a group, target 0.
- ``triplet`` (ImageBERT, VSE++-style): hinge between the positive and the *hardest* negative
  of each group (on sigmoid scores, like ``margin``).
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F


def margin_loss(scores: torch.Tensor, margin: float) -> torch.Tensor:
    s = scores.sigmoid()
    return (margin + s[:, 1:] - s[:, :1]).clamp(min=0).mean()


def bce_loss(scores: torch.Tensor, margin: float) -> torch.Tensor:
    labels = torch.zeros_like(scores)
    labels[:, 0] = 1.0
    return F.binary_cross_entropy_with_logits(scores, labels)


def mce_loss(scores: torch.Tensor, margin: float) -> torch.Tensor:
    return F.cross_entropy(scores, torch.zeros(len(scores), dtype=torch.long,
                                               device=scores.device))


def triplet_loss(scores: torch.Tensor, margin: float) -> torch.Tensor:
    s = scores.sigmoid()
    return (margin + s[:, 1:].max(1).values - s[:, 0]).clamp(min=0).mean()


RETRIEVAL_LOSSES: dict[str, Callable[[torch.Tensor, float], torch.Tensor]] = {
    "margin": margin_loss, "bce": bce_loss, "mce": mce_loss, "triplet": triplet_loss}


def hardest_rows(scores: torch.Tensor, image_negatives: int, text_negatives: int,
                 keep: int) -> torch.Tensor:
    """Row indices (into the flat batch) of each group's positive and the ``keep`` highest
    scoring candidates of each side. ``scores`` [E, 1 + m_img + m_txt] from a no-grad pass;
    the result [E, 1 + 2·keep] keeps the group layout [positive, image negs, text negs]."""
    E, G = scores.shape
    base = torch.arange(E, device=scores.device)[:, None] * G
    img = scores[:, 1:1 + image_negatives].topk(keep, dim=1).indices + 1
    txt = scores[:, 1 + image_negatives:].topk(keep, dim=1).indices + 1 + image_negatives
    pos = torch.zeros(E, 1, dtype=torch.long, device=scores.device)
    return base + torch.cat([pos, img, txt], 1)
