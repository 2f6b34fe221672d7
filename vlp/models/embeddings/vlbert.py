"""VL-BERT embeddings: token + visual feature + segment + sequence position, then BERT's LN.

Sequence: ``[CLS] sentence [SEP] [IMG]×N [END]``. Every element carries a *visual feature
embedding* ReLU(Linear([geometry ; appearance])): RoI tokens use their own box and feature,
text tokens and [END] use the whole image (box (0, 0, 1, 1), ``image_feat``: the image's
whole-image RoI feature, the same in every example of the image whatever is masked — see
``vlp.datasets.batching.task_batch.whole_image_feature`` for what that leaves of the paper's
no-leak rule). A masked RoI's visual feature embedding is replaced by a learned embedding.
Segments: text A = 0, image and [END] C = 2.
Text positions are sequential; all [IMG] tokens share one position (the one after [SEP]),
[END] takes the next.
"""

from __future__ import annotations

import math
from typing import Mapping

import torch
from torch import nn

from vlp.contract import batch_spec as bs

from vlp.contract.batch_access import check_last_dim, require
from vlp.models.family_config import TransformerConfig, VLBertVisualConfig
from vlp.models.embeddings.embedded_inputs import EmbeddedInputs
from vlp.models.embeddings.text import TextEmbeddings

SEGMENT_IMAGE = 2
WHOLE_IMAGE_BOX = (0.0, 0.0, 1.0, 1.0)


def sine_box_geometry(boxes: torch.Tensor, dim: int, wave_length: float = 1000.0) -> torch.Tensor:
    """[..., 4] normalised (x1, y1, x2, y2) → [..., dim]: (xc, yc, w, h) × 100 divided by
    wave_length^(i / (dim/8)), sin and cos, for i < dim/8 (VL-BERT: dim 2048, 256 waves)."""
    x1, y1, x2, y2 = boxes.float().unbind(-1)
    coords = torch.stack([(x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1], dim=-1) * 100.0
    waves = dim // 8
    exponent = torch.arange(waves, device=boxes.device, dtype=torch.float32) / waves
    scaled = coords.unsqueeze(-1) / wave_length ** exponent          # [..., 4, waves]
    return torch.cat([scaled.sin(), scaled.cos()], dim=-1).flatten(-2)  # [..., 4 * 2 * waves]


class VLBertEmbedder(nn.Module):
    def __init__(self, cfg: TransformerConfig, visual: VLBertVisualConfig, feat_dim: int):
        super().__init__()
        if cfg.type_vocab_size < 3:
            raise ValueError("VL-BERT needs transformer.type_vocab_size ≥ 3 (segments A, B, C)")
        h = cfg.hidden_size
        self.geometry_dim = visual.geometry_dim
        self.location_width = visual.location_width
        self.visual_linear = nn.Linear(visual.geometry_dim + feat_dim, h)
        self.img_token = nn.Parameter(torch.zeros(h))       # [IMG] token embedding
        self.end_token = nn.Parameter(torch.zeros(h))       # [END] token embedding
        self.masked_roi = nn.Parameter(torch.zeros(h))      # replaces a masked RoI's visual emb.
        self.dropout = nn.Dropout(cfg.hidden_dropout)

    def init_extra_(self, std: float) -> None:
        for p in (self.img_token, self.end_token, self.masked_roi):
            nn.init.normal_(p, std=std)

    def visual_feature_embedding(self, boxes: torch.Tensor, feats: torch.Tensor) -> torch.Tensor:
        geometry = sine_box_geometry(boxes, self.geometry_dim).to(feats.dtype)
        return torch.relu(self.visual_linear(torch.cat([geometry, feats], dim=-1)))

    def forward(self, batch: Mapping[str, torch.Tensor], text: TextEmbeddings,
                visual_masking: bool = False) -> EmbeddedInputs:
        who = "VL-BERT embeddings"
        ids = require(batch, bs.INPUT_IDS, who)
        text_mask = require(batch, bs.TEXT_MASK, who).bool()
        dtype = self.visual_linear.weight.dtype  # bf16 engines hold bf16 weights
        feats = require(batch, bs.REGION_FEATS, who).to(dtype)
        loc = require(batch, bs.REGION_LOC, who)
        check_last_dim(loc, bs.REGION_LOC, self.location_width, who)
        image_feat = require(batch, bs.IMAGE_FEAT, who).to(dtype)
        region_mask = require(batch, bs.REGION_MASK, who).bool()

        whole_box = loc.new_tensor(WHOLE_IMAGE_BOX).expand(image_feat.shape[0], 4)
        whole = self.visual_feature_embedding(whole_box, image_feat)         # [B, H]
        roi = self.visual_feature_embedding(loc, feats)                      # [B, N, H]
        zeroed = batch.get(bs.REGION_ZEROED)
        if zeroed is not None:
            roi = torch.where(zeroed.bool().unsqueeze(-1), self.masked_roi.to(roi.dtype), roi)

        text_len = text_mask.sum(1)
        position = text.position_embeddings
        segment = text.token_type(SEGMENT_IMAGE)
        region_segment = text.token_types(batch.get(bs.REGION_TYPE_IDS), SEGMENT_IMAGE)
        regions = (self.img_token + roi + region_segment
                   + position(text_len).unsqueeze(1))
        end = self.end_token + whole + segment + position(text_len + 1)
        # VL-BERT sums all four embeddings then applies BERT's one embedding LayerNorm
        visual = text.LayerNorm(torch.cat([regions, end.unsqueeze(1)], dim=1))
        end_mask = torch.ones_like(region_mask[:, :1])
        return EmbeddedInputs(
            text=text(ids, token_type=batch.get(bs.TEXT_TYPE_IDS, 0), extra=whole.unsqueeze(1)),
            text_mask=text_mask,
            visual=self.dropout(visual),
            visual_mask=torch.cat([region_mask, end_mask], dim=1),
            num_regions=feats.shape[1],
        )
