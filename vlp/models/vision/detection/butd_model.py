"""BUTD's Faster R-CNN (Anderson et al. 2018) as a torch module, in detectron2's parameter
layout: ``backbone`` (ResNet C4), ``proposal_generator`` (single-level RPN),
``roi_heads.res5`` (RoI pooling 14×14 → res5 → mean-pooled 2048-d) and
``roi_heads.box_predictor`` (1601-way classifier; per-class box deltas; the attribute head
when the weights have one)."""

from __future__ import annotations

import torch
from torch import nn

from vlp.models.vision.detection.butd_config import ButdConfig
from vlp.models.vision.detection.resnet_c4 import ResNetC4, init_random, res5_head
from vlp.models.vision.detection.roi_align import roi_align
from vlp.models.vision.detection.roi_pool import roi_pool
from vlp.models.vision.detection.rpn import Rpn


class BoxPredictor(nn.Module):
    """Class scores and box deltas from a pooled RoI feature. ``bbox_pred`` (and the
    attribute head) are kept so the public weights load whole, but BUTD's regions use the
    RoIs as proposed (its feature dump does not regress them) and the region store has no
    attribute column, so neither is evaluated."""

    def __init__(self, dim: int, cfg: ButdConfig, attributes: bool):
        super().__init__()
        self.cls_score = nn.Linear(dim, cfg.num_classes)
        self.bbox_pred = nn.Linear(dim, (cfg.num_classes - 1) * 4)
        nn.init.normal_(self.cls_score.weight, std=0.01)
        nn.init.normal_(self.bbox_pred.weight, std=0.001)
        nn.init.zeros_(self.cls_score.bias)
        nn.init.zeros_(self.bbox_pred.bias)
        if attributes:
            self.cls_embedding = nn.Embedding(cfg.num_classes, cfg.attribute_embed)
            self.fc_attr = nn.Linear(dim + cfg.attribute_embed, cfg.attribute_hidden)
            self.attr_score = nn.Linear(cfg.attribute_hidden, cfg.num_attributes)


class RoiHeads(nn.Module):
    def __init__(self, cfg: ButdConfig, attributes: bool):
        super().__init__()
        self.cfg = cfg
        self.res5 = res5_head(cfg.backbone)
        self.box_predictor = BoxPredictor(cfg.backbone.res5_channels, cfg, attributes)

    def pooled(self, c4: torch.Tensor, rois: torch.Tensor, stride: int) -> torch.Tensor:
        """(K, 5) RoIs (image index, x1y1x2y2 in input pixels) → (K, D) features."""
        if self.cfg.pooler == "roi_pool":
            x = roi_pool(c4, rois, self.cfg.pooler_resolution, 1.0 / stride)
        else:
            x = roi_align(c4, rois, self.cfg.pooler_resolution, 1.0 / stride,
                          self.cfg.sampling_ratio, self.cfg.aligned)
        return self.res5(x).float().mean(dim=(2, 3))


class ButdDetector(nn.Module):
    def __init__(self, cfg: ButdConfig, attributes: bool = False):
        super().__init__()
        self.cfg = cfg
        self.backbone = ResNetC4(cfg.backbone)
        self.proposal_generator = Rpn(cfg.backbone.c4_channels, cfg.rpn_hidden, cfg.rpn,
                                      stride=ResNetC4.stride)
        self.roi_heads = RoiHeads(cfg, attributes)
        # what the pixels are normalised with (a checkpoint must agree: butd_convert.py)
        self.register_buffer("pixel_mean", torch.tensor(cfg.pixel_mean_bgr), persistent=False)
        self.register_buffer("pixel_std", torch.ones(3), persistent=False)

    @property
    def has_attributes(self) -> bool:
        return hasattr(self.roi_heads.box_predictor, "attr_score")

    def reset_random(self) -> None:
        with torch.no_grad():
            init_random(self.backbone)
            init_random(self.roi_heads.res5)

    def forward(self, images: torch.Tensor, autocast_dtype: torch.dtype | None = None
                ) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]:
        """images (B, 3, H, W), all of one size, normalised BGR → (proposals per image
        (x1y1x2y2, input pixels), pooled features (B·(P+1), D) — each image's proposals
        then one whole-image RoI — and class probabilities of the same rows)."""
        b, _, h, w = images.shape
        device = images.device
        with torch.autocast(device.type, dtype=autocast_dtype or torch.float32,
                            enabled=autocast_dtype is not None):
            c4 = self.backbone(images)
            proposals = self.proposal_generator(c4, [(h, w)] * b)
            whole = torch.tensor([[0.0, 0.0, float(w), float(h)]], device=device)
            rois = torch.cat([torch.cat([torch.full((p.shape[0] + 1, 1), float(i), device=device),
                                         torch.cat([p.float(), whole])], dim=1)
                              for i, p in enumerate(proposals)])
            pooled = self.roi_heads.pooled(c4, rois, ResNetC4.stride)
        logits = self.roi_heads.box_predictor.cls_score(pooled)
        return proposals, pooled, torch.softmax(logits.float(), dim=1)
