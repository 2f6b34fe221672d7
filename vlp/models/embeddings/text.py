"""BERT text embeddings: LN(word + position + token type [+ family extra]), dropout.

Parameter names match BERT's ``embeddings.*`` (and UNITER's ``uniter.embeddings.*``) so
checkpoints map by prefix. The token-type table is shared with the visual side: UNITER and
ImageBERT embed regions with token type 1, VL-BERT with segment C = 2, SOHO with 1.
"""

from __future__ import annotations

import torch
from torch import nn

from ..config import TransformerConfig


class TextEmbeddings(nn.Module):
    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(cfg.vocab_size, cfg.hidden_size, padding_idx=0)
        self.position_embeddings = nn.Embedding(cfg.max_position_embeddings, cfg.hidden_size)
        self.token_type_embeddings = nn.Embedding(cfg.type_vocab_size, cfg.hidden_size)
        self.LayerNorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.dropout = nn.Dropout(cfg.hidden_dropout)

    def forward(self, input_ids: torch.Tensor, token_type: int = 0,
                extra: torch.Tensor | None = None) -> torch.Tensor:
        """``input_ids`` [B, T] → [B, T, H]. Positions are 0..T-1 ([CLS] at 0); ``extra`` is a
        family term summed before the LayerNorm (VL-BERT's visual feature embedding)."""
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = (self.word_embeddings(input_ids) + self.position_embeddings(positions)[None]
             + self.token_type_embeddings.weight[token_type])
        if extra is not None:
            x = x + extra
        return self.dropout(self.LayerNorm(x))

    def token_type(self, index: int) -> torch.Tensor:
        """One row of the token-type table, [H] (broadcasts over visual tokens)."""
        return self.token_type_embeddings.weight[index]
