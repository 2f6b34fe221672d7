"""NLVR2 heads, UNITER's three variants (Appendix, Table 6).

- triplet: one sequence holds both images; Linear(H, 2) on the pooled [CLS].
- pair: two sequences (statement + left, statement + right, consecutive rows); the two pooled
  vectors are concatenated and an MLP (2H → 2H → GELU → LN → 2) classifies.
- pair-biattn: multi-head attention from each sequence to the other (keys padded out), a
  Linear(2H, H) + ReLU (the reference's activation here, not GELU) fuses each token with what
  it attended to, attention pooling (softmax
  over ReLU(Linear(H, 1)) scores, padding masked) gives one vector per side, Linear(2H, 2).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from vlp.contract import downstream_keys as D

from vlp.models.heads.head import Batch, DownstreamHead, accuracy, encode, mlp


class _Nlvr2Head(DownstreamHead):
    def __init__(self, name: str):
        super().__init__()
        self.name = name

    def losses(self, backbone, batch: Batch) -> dict[str, torch.Tensor]:
        logits = self.predict(backbone, batch).float()
        labels = batch[D.LABELS].long()
        return {f"{self.name}_loss": F.cross_entropy(logits, labels),
                f"{self.name}_acc": accuracy(logits, labels)}


class TripletHead(_Nlvr2Head):
    def __init__(self, name: str, hidden: int, eps: float = 1e-12):
        super().__init__(name)
        self.out = nn.Linear(hidden, 2)

    def predict(self, backbone, batch: Batch) -> torch.Tensor:
        return self.out(encode(backbone, batch).pooled_output)


class PairHead(_Nlvr2Head):
    def __init__(self, name: str, hidden: int, eps: float = 1e-12):
        super().__init__(name)
        self.mlp = mlp(2 * hidden, 2 * hidden, 2, eps)

    def predict(self, backbone, batch: Batch) -> torch.Tensor:
        pooled = encode(backbone, batch).pooled_output            # [2E, H]: left, right, …
        return self.mlp(pooled.reshape(-1, 2 * pooled.shape[-1]))


class AttentionPool(nn.Module):
    """softmax over ReLU(Linear(H, 1)) scores, padding excluded, then the weighted sum."""

    def __init__(self, hidden: int, dropout: float):
        super().__init__()
        self.score = nn.Sequential(nn.Linear(hidden, 1), nn.ReLU(), nn.Dropout(dropout))

    def forward(self, x: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        s = self.score(x).squeeze(-1).float().masked_fill(pad, float("-inf"))
        return (s.softmax(-1).to(x.dtype).unsqueeze(1) @ x).squeeze(1)


class PairBiAttnHead(_Nlvr2Head):
    def __init__(self, name: str, hidden: int, num_heads: int, dropout: float = 0.1,
                 eps: float = 1e-12):
        super().__init__(name)
        self.attn_l2r = nn.MultiheadAttention(hidden, num_heads, dropout=dropout,
                                              batch_first=True)
        self.attn_r2l = nn.MultiheadAttention(hidden, num_heads, dropout=dropout,
                                              batch_first=True)
        self.fuse = nn.Sequential(nn.Linear(2 * hidden, hidden), nn.ReLU(), nn.Dropout(dropout))
        self.pool = AttentionPool(hidden, dropout)
        self.out = nn.Linear(2 * hidden, 2)

    def predict(self, backbone, batch: Batch) -> torch.Tensor:
        enc = encode(backbone, batch)
        seq, pad = enc.sequence_output, enc.attention_mask == 0   # [2E, L, H], [2E, L]
        left, right = seq[0::2], seq[1::2]
        lpad, rpad = pad[0::2], pad[1::2]
        l2r, _ = self.attn_l2r(left, right, right, key_padding_mask=rpad, need_weights=False)
        r2l, _ = self.attn_r2l(right, left, left, key_padding_mask=lpad, need_weights=False)
        left = self.pool(self.fuse(torch.cat([l2r, left], -1)), lpad)
        right = self.pool(self.fuse(torch.cat([r2l, right], -1)), rpad)
        return self.out(torch.cat([left, right], -1))


NLVR2_HEADS = {"triplet": TripletHead, "pair": PairHead, "pair-biattn": PairBiAttnHead}
