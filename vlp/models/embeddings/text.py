"""BERT text embeddings: LN(word + position + token type [+ family extra]), dropout.

Parameter names match BERT's ``embeddings.*`` (and UNITER's ``uniter.embeddings.*``) so
checkpoints map by prefix. The token-type table is shared with the visual side: UNITER and
ImageBERT embed regions with token type 1, VL-BERT with segment C = 2, SOHO with 1.
"""

from __future__ import annotations

import torch
from torch import nn

from vlp.models.family_config import TransformerConfig


class TextEmbeddings(nn.Module):
    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(cfg.vocab_size, cfg.hidden_size, padding_idx=0)
        self.position_embeddings = nn.Embedding(cfg.max_position_embeddings, cfg.hidden_size)
        self.token_type_embeddings = nn.Embedding(cfg.type_vocab_size, cfg.hidden_size)
        self.LayerNorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.dropout = nn.Dropout(cfg.hidden_dropout)

    def forward(self, input_ids: torch.Tensor, token_type: int | torch.Tensor = 0,
                extra: torch.Tensor | None = None) -> torch.Tensor:
        """``input_ids`` [B, T] → [B, T, H]. Positions are 0..T-1 ([CLS] at 0); ``token_type``
        is one type for all tokens or a long [B, T] per token (downstream tasks that tell
        question / answer / rationale apart); ``extra`` is a family term summed before the
        LayerNorm (VL-BERT's visual feature embedding)."""
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = (self.word_embeddings(input_ids) + self.position_embeddings(positions)[None]
             + self.token_types(token_type))
        if extra is not None:
            x = x + extra
        return self.dropout(self.LayerNorm(x))

    def token_type(self, index: int) -> torch.Tensor:
        """One row of the token-type table, [H] (broadcasts over visual tokens)."""
        return self.token_type_embeddings.weight[index]

    def token_types(self, types: int | torch.Tensor | None, default: int = 0) -> torch.Tensor:
        """[H] for one type (``types`` an int, or None → ``default``), [B, n, H] for a long
        [B, n] of per-token types. Pretraining batches carry none: every text token is type 0
        and every visual token the family's image type, as the pretrained weights expect."""
        if types is None:
            return self.token_type(default)
        if isinstance(types, int):
            return self.token_type(types)
        return self.token_type_embeddings(types.long())

    def extend_token_types(self, copy_from: list[int]) -> None:
        """Append one row per entry of ``copy_from``, initialised as a copy of that existing
        row (UNITER: NLVR2's second image starts as the image type, VCR's answer and rationale
        as the text type), leaving the pretrained rows untouched."""
        old = self.token_type_embeddings
        n = old.num_embeddings
        if any(not 0 <= i < n for i in copy_from):
            raise ValueError(f"extend_token_types: rows to copy {copy_from} outside the "
                             f"{n} existing token types")
        new = nn.Embedding(n + len(copy_from), old.embedding_dim, device=old.weight.device,
                           dtype=old.weight.dtype)
        with torch.no_grad():
            new.weight[:n] = old.weight
            for k, i in enumerate(copy_from):
                new.weight[n + k] = old.weight[i]
        self.token_type_embeddings = new
