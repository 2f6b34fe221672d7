"""UNITER region embeddings (names as in ``uniter.img_embeddings.*`` of the release).

region = LN( LN(img_linear(feat + mask_emb)) + LN(pos_linear(loc7)) + token_type(1) ), dropout.
Masked regions arrive zeroed; the learned 2048-d mask embedding (row 1 of an Embedding(2, D)
whose row 0 is held at zero) is added to those rows only. Regions get no position id.
"""

from __future__ import annotations

from typing import Mapping

import torch
from torch import nn

from vlp.contract import batch_spec as bs

from vlp.contract.batch_access import check_last_dim, require
from vlp.models.family_config import TransformerConfig, UniterVisualConfig
from vlp.models.embeddings.embedded_inputs import EmbeddedInputs
from vlp.models.embeddings.text import TextEmbeddings


class UniterEmbedder(nn.Module):
    def __init__(self, cfg: TransformerConfig, visual: UniterVisualConfig, feat_dim: int):
        super().__init__()
        h, eps = cfg.hidden_size, cfg.layer_norm_eps
        self.location_width = visual.location_width
        self.img_linear = nn.Linear(feat_dim, h)
        self.img_layer_norm = nn.LayerNorm(h, eps=eps)
        self.pos_linear = nn.Linear(visual.location_width, h)
        self.pos_layer_norm = nn.LayerNorm(h, eps=eps)
        # padding_idx keeps row 0 at zero and out of the gradient; we only ever read row 1
        self.mask_embedding = nn.Embedding(2, feat_dim, padding_idx=0)
        self.LayerNorm = nn.LayerNorm(h, eps=eps)
        self.dropout = nn.Dropout(cfg.hidden_dropout)

    @property
    def feature_projection(self) -> nn.Linear:
        """The feature Linear whose weight MRFR's output projection reuses (tied)."""
        return self.img_linear

    def forward(self, batch: Mapping[str, torch.Tensor], text: TextEmbeddings,
                visual_masking: bool = False) -> EmbeddedInputs:
        who = "UNITER embeddings"
        dtype = self.img_linear.weight.dtype  # bf16 engines hold bf16 weights; batches are fp32
        feats = require(batch, bs.REGION_FEATS, who).to(dtype)
        loc = require(batch, bs.REGION_LOC, who).to(dtype)
        check_last_dim(loc, bs.REGION_LOC, self.location_width, who)
        zeroed = batch.get(bs.REGION_ZEROED)
        if zeroed is not None:
            feats = feats + zeroed.unsqueeze(-1).to(feats.dtype) * self.mask_embedding.weight[1]
        regions = self.LayerNorm(self.img_layer_norm(self.img_linear(feats))
                                 + self.pos_layer_norm(self.pos_linear(loc))
                                 + text.token_types(batch.get(bs.REGION_TYPE_IDS), 1))
        ids = require(batch, bs.INPUT_IDS, who)
        return EmbeddedInputs(
            text=text(ids, token_type=batch.get(bs.TEXT_TYPE_IDS, 0)),
            text_mask=require(batch, bs.TEXT_MASK, who).bool(),
            visual=self.dropout(regions),
            visual_mask=require(batch, bs.REGION_MASK, who).bool(),
            num_regions=feats.shape[1],
        )
