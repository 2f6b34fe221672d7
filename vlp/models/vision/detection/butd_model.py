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
from vlp.models.vision.extractors.padded_batch import masked_extents


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

    def pooled(self, c4: torch.Tensor, rois: list[torch.Tensor], stride: int,
               feature_hw: list[tuple[int, int]]) -> torch.Tensor:
        """Per image, (K_i, 4) RoIs (x1y1x2y2 in input pixels) → (ΣK_i, D) features. Each
        image pools from its own extent of the map (a padded canvas' border cells are not
        its cells: RoIPool clips bins, RoIAlign weighs samples outside the map 0), then one
        res5 over every RoI of the batch."""
        fh, fw = c4.shape[-2:]
        if all(hw == (fh, fw) for hw in feature_hw):
            index = torch.cat([torch.full((r.shape[0], 1), float(i), device=c4.device)
                               for i, r in enumerate(rois)])
            x = self._pool(c4, torch.cat([index, torch.cat(rois)], dim=1), stride)
        else:
            x = torch.cat([self._pool(c4[i:i + 1, :, :h, :w],
                                      torch.cat([r.new_zeros((r.shape[0], 1)), r], dim=1),
                                      stride)
                           for i, (r, (h, w)) in enumerate(zip(rois, feature_hw))])
        return self.res5(x).float().mean(dim=(2, 3))

    def _pool(self, c4: torch.Tensor, rois: torch.Tensor, stride: int) -> torch.Tensor:
        if self.cfg.pooler == "roi_pool":
            return roi_pool(c4, rois, self.cfg.pooler_resolution, 1.0 / stride)
        return roi_align(c4, rois, self.cfg.pooler_resolution, 1.0 / stride,
                         self.cfg.sampling_ratio, self.cfg.aligned)


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

    def forward(self, images: torch.Tensor, autocast_dtype: torch.dtype | None = None,
                sizes: list[tuple[int, int]] | None = None,
                given: list[torch.Tensor] | None = None
                ) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]:
        """images (B, 3, H, W), normalised BGR: a padded canvas (padded_batch.py) whose
        images have the (h, w) ``sizes`` (default: each fills it) → (proposals per image
        (x1y1x2y2, input pixels), pooled features (B·(P+1), D) — each image's proposals
        then one whole-image RoI — and class probabilities of the same rows).

        ``given``: per image, (P_i, 4) boxes in input pixels that stand in for the RPN's
        proposals (the RPN does not run): the same RoI pooling and head, so a given box's
        feature is the one the box gets when the RPN proposes it."""
        b, _, h, w = images.shape
        sizes = list(sizes) if sizes is not None else [(h, w)] * b
        if given is not None and len(given) != b:
            raise ValueError(f"given boxes for {len(given)} images, the batch has {b}")
        with torch.autocast(images.device.type, dtype=autocast_dtype or torch.float32,
                            enabled=autocast_dtype is not None), \
                masked_extents([self.backbone, self.proposal_generator], sizes,
                               (h, w)) as extents:
            c4 = self.backbone(images)
            c4_hw = extents.at(c4)
            proposals = (self.proposal_generator(c4, sizes, c4_hw) if given is None
                         else [g.float() for g in given])
            rois = [torch.cat([p.float(), p.new_tensor([[0.0, 0.0, float(iw), float(ih)]])
                               .float()])
                    for p, (ih, iw) in zip(proposals, sizes)]
            pooled = self.roi_heads.pooled(c4, rois, ResNetC4.stride, c4_hw)
        logits = self.roi_heads.box_predictor.cls_score(pooled)
        return proposals, pooled, torch.softmax(logits.float(), dim=1)
