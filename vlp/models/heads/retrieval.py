"""Image–text retrieval: a match score per (text, image) row from the pooled [CLS].

The score head is Linear(H, 1). From a pretrained ITM head (Linear(H, 2)) it starts as the
log-odds of "match": weight = w_match − w_nomatch, bias likewise — it ranks pairs exactly as
the pretrained P(match) does (ITM's softmax CE only identifies the logits' difference; UNITER
copies the match row alone, which ranks by a quantity ITM never trained). Zero-shot
evaluation uses this initial score, so it is the pretrained ITM ranking.

In-batch groups (SOHO §4.2.1, loss ``in-batch-binary``) carry ``match_labels``: a caption of
the same image elsewhere in the batch is labelled a match, not a negative.

Hard negatives (UNITER): when the batch carries ``hard_keep = k > 0``, each group holds m
candidates per side; a no-grad pass scores them all and the training pass sees the positive
and the top k of each side.
"""

from __future__ import annotations

import torch
from torch import nn

from vlp.contract import downstream_keys as D

from vlp.models.heads.head import Batch, DownstreamHead, encode, group_view
from vlp.models.heads.retrieval_losses import RETRIEVAL_LOSSES, group_labels, hardest_rows


class MatchScorer(DownstreamHead):
    def __init__(self, name: str, hidden: int, loss: str = "margin", margin: float = 0.2,
                 itm_head: nn.Linear | None = None):
        super().__init__()
        if loss not in RETRIEVAL_LOSSES:
            raise ValueError(f"unknown retrieval loss {loss!r}; known: {list(RETRIEVAL_LOSSES)}")
        self.name, self.loss_name, self.margin = name, loss, margin
        self.out = nn.Linear(hidden, 1)
        self.from_itm = itm_head is not None
        if itm_head is not None:
            with torch.no_grad():
                self.out.weight.copy_(itm_head.weight[1:] - itm_head.weight[:1])
                self.out.bias.copy_(itm_head.bias[1:] - itm_head.bias[:1])

    def predict(self, backbone, batch: Batch) -> torch.Tensor:
        """[rows] match scores (log-odds)."""
        return self.out(encode(backbone, batch).pooled_output).squeeze(-1)

    def losses(self, backbone, batch: Batch) -> dict[str, torch.Tensor]:
        keep = int(batch.get(D.HARD_KEEP, 0))
        if keep:
            batch = self.mine(backbone, batch, keep)
        scores = group_view(self.predict(backbone, batch).float(), batch)   # [E, G]
        labels = (batch[D.MATCH_LABELS].view_as(scores).to(scores.dtype)
                  if D.MATCH_LABELS in batch else group_labels(scores))
        loss = RETRIEVAL_LOSSES[self.loss_name](scores, self.margin, labels)
        with torch.no_grad():   # share of groups whose positive outscores every negative
            top = (scores[:, :1] > scores[:, 1:]).all(1).float().mean()
        return {f"{self.name}_loss": loss, f"{self.name}_top1": top}

    @torch.no_grad()
    def mine(self, backbone, batch: Batch, keep: int) -> dict[str, torch.Tensor]:
        """The sub-batch of positives and the ``keep`` hardest candidates of each side."""
        scores = group_view(self.predict(backbone, batch).float(), batch)
        rows = hardest_rows(scores, int(batch[D.IMAGE_NEGATIVES]),
                            int(batch[D.TEXT_NEGATIVES]), keep).reshape(-1)
        n = scores.numel()
        out = {k: (v[rows] if v.ndim and v.shape[0] == n else v) for k, v in batch.items()}
        out.update({D.GROUP_SIZE: torch.tensor(1 + 2 * keep), D.HARD_KEEP: torch.tensor(0),
                    D.IMAGE_NEGATIVES: torch.tensor(keep), D.TEXT_NEGATIVES: torch.tensor(keep)})
        return out
