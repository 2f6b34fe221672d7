"""Retrieval finetuning losses over groups ``[positive, negatives…]`` of match scores.

Every loss takes ``(scores [E, G], margin, labels [E, G])``: ``labels`` is 1 where a row's
caption belongs to its image (the group's first row, and in an in-batch group any other
caption of the same image), 0 elsewhere.

- ``margin`` (UNITER §4.1 / Appendix, its default): hinge with margin 0.2 between
  sigmoid(positive) and each sigmoid(negative), averaged over the negatives of all groups.
- ``binary`` (ImageBERT §4.4 "Binary classification Loss", its best: §5.3, Table 4 part 4,
  Flickr30k IR R@1 73.1 vs 70.6 with the triplet loss): binary cross-entropy on every row of
  the group (sampled negatives of both sides), mean over rows.
- ``in-batch-binary`` (SOHO §4.2.1): the same binary cross-entropy, on in-batch groups: each
  image of the mini-batch with every caption of the mini-batch ("all the other t−1 captions
  are used as the unaligned captions for each image"); the data adapter builds the groups.
- ``mce`` (ImageBERT): cross-entropy over the P = 1 + negatives scores of a group, target 0.
- ``triplet`` (ImageBERT, VSE++-style): hinge between the positive and the *hardest* negative
  of each group (on sigmoid scores, like ``margin``).
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F


def group_labels(scores: torch.Tensor) -> torch.Tensor:
    """The labels of sampled groups: the first row of each group matches, no other."""
    labels = torch.zeros_like(scores)
    labels[:, 0] = 1.0
    return labels


def margin_loss(scores: torch.Tensor, margin: float, labels: torch.Tensor) -> torch.Tensor:
    s = scores.sigmoid()
    return (margin + s[:, 1:] - s[:, :1]).clamp(min=0).mean()


def binary_loss(scores: torch.Tensor, margin: float, labels: torch.Tensor) -> torch.Tensor:
    return F.binary_cross_entropy_with_logits(scores, labels.to(scores.dtype))


def mce_loss(scores: torch.Tensor, margin: float, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(scores, torch.zeros(len(scores), dtype=torch.long,
                                               device=scores.device))


def triplet_loss(scores: torch.Tensor, margin: float, labels: torch.Tensor) -> torch.Tensor:
    s = scores.sigmoid()
    return (margin + s[:, 1:].max(1).values - s[:, 0]).clamp(min=0).mean()


RETRIEVAL_LOSSES: dict[str, Callable[[torch.Tensor, float, torch.Tensor], torch.Tensor]] = {
    "margin": margin_loss, "binary": binary_loss, "in-batch-binary": binary_loss,
    "mce": mce_loss, "triplet": triplet_loss}
# the losses whose groups are the mini-batch's own pairs (no sampled negatives)
IN_BATCH_LOSSES = ("in-batch-binary",)


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
