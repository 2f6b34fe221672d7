"""VCR multiple choice as UNITER does it (Appendix A.2): "a classifier over two classes
('right' or 'wrong') for each question-answer pair (question-answer-rationale triplet)".

Each (question, choice) row is classified on its own by Linear(H, 2H) → ReLU → LayerNorm →
Linear(2H, 2) on the pooled [CLS] (the reference's ``vcr_output``: ReLU here, where its other
heads use GELU); the loss is CE over {wrong, right} per row, averaged over rows (one right and
three wrong rows per group); a group's choices are ranked by P(right). A softmax over the 4
choices would make the choices compete in the loss; the paper's rows do not.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from vlp.contract import downstream_keys as D

from vlp.models.heads.head import Batch, DownstreamHead, accuracy, encode, group_view

RIGHT = 1   # class index of "right" (0 = "wrong")


class ChoicePairClassifier(DownstreamHead):
    def __init__(self, name: str, hidden: int, eps: float = 1e-12):
        super().__init__()
        self.name = name
        self.mlp = nn.Sequential(nn.Linear(hidden, 2 * hidden), nn.ReLU(),
                                 nn.LayerNorm(2 * hidden, eps=eps), nn.Linear(2 * hidden, 2))

    def logits(self, backbone, batch: Batch) -> torch.Tensor:
        """[rows, 2] wrong/right logits, one row per (question, choice)."""
        return self.mlp(encode(backbone, batch).pooled_output)

    def predict(self, backbone, batch: Batch) -> torch.Tensor:
        """[groups, choices] P(right) of each choice; the prediction is its argmax."""
        p = self.logits(backbone, batch).float().softmax(-1)[:, RIGHT]
        return group_view(p, batch)

    def losses(self, backbone, batch: Batch) -> dict[str, torch.Tensor]:
        logits = self.logits(backbone, batch).float()
        labels = batch[D.LABELS].long()                      # [groups] the right choice
        group = int(batch[D.GROUP_SIZE])
        choice = torch.arange(group, device=labels.device)
        targets = (choice[None, :] == labels[:, None]).long().reshape(-1)   # [rows] 1 = right
        ranked = group_view(logits.detach().softmax(-1)[:, RIGHT], batch)
        return {f"{self.name}_loss": F.cross_entropy(logits, targets),
                f"{self.name}_acc": accuracy(ranked, labels)}
