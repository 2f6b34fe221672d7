"""ImageBERT region embeddings.

region = LN( img_linear(feat) + pos_linear(loc5) + segment(1) + dummy position ), dropout —
the paper's e = LN(v + s + p_img + p_seq), with one learned sequence position shared by all
visual tokens (RoIs have no order; their coordinates are already in p_img). MOC's masked rows
arrive zeroed (90%) or kept (10%); ImageBERT has no learned mask embedding.
"""

from __future__ import annotations

from typing import Mapping

import torch
from torch import nn

from vlp.contract import batch_spec as bs

from vlp.contract.batch_access import check_last_dim, require
from vlp.models.family_config import ImageBertVisualConfig, TransformerConfig
from vlp.models.embeddings.embedded_inputs import EmbeddedInputs
from vlp.models.embeddings.text import TextEmbeddings


class ImageBertEmbedder(nn.Module):
    def __init__(self, cfg: TransformerConfig, visual: ImageBertVisualConfig, feat_dim: int):
        super().__init__()
        h = cfg.hidden_size
        self.location_width = visual.location_width
        self.img_linear = nn.Linear(feat_dim, h)
        self.pos_linear = nn.Linear(visual.location_width, h)
        self.visual_position = nn.Parameter(torch.zeros(h))
        self.LayerNorm = nn.LayerNorm(h, eps=cfg.layer_norm_eps)
        self.dropout = nn.Dropout(cfg.hidden_dropout)

    def init_extra_(self, std: float) -> None:
        nn.init.normal_(self.visual_position, std=std)

    @property
    def feature_projection(self) -> nn.Linear:
        return self.img_linear

    def forward(self, batch: Mapping[str, torch.Tensor], text: TextEmbeddings,
                visual_masking: bool = False) -> EmbeddedInputs:
        who = "ImageBERT embeddings"
        dtype = self.img_linear.weight.dtype  # bf16 engines hold bf16 weights; batches are fp32
        feats = require(batch, bs.REGION_FEATS, who).to(dtype)
        loc = require(batch, bs.REGION_LOC, who).to(dtype)
        check_last_dim(loc, bs.REGION_LOC, self.location_width, who)
        regions = self.LayerNorm(self.img_linear(feats) + self.pos_linear(loc)
                                 + text.token_types(batch.get(bs.REGION_TYPE_IDS), 1)
                                 + self.visual_position)
        return EmbeddedInputs(
            text=text(require(batch, bs.INPUT_IDS, who),
                      token_type=batch.get(bs.TEXT_TYPE_IDS, 0)),
            text_mask=require(batch, bs.TEXT_MASK, who).bool(),
            visual=self.dropout(regions),
            visual_mask=require(batch, bs.REGION_MASK, who).bool(),
            num_regions=feats.shape[1],
        )
