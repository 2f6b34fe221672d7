"""The sizes of the BUTD detector: ``base`` is the public model (py-bottom-up-attention's
``faster_rcnn_R_101_C4_attr_caffemaxpool.yaml``), ``tiny`` a few-channel copy for tests."""

from __future__ import annotations

from dataclasses import dataclass

from vlp.models.vision.detection.resnet_c4 import C4Shape
from vlp.models.vision.detection.rpn import RpnSettings

POOLERS = ("roi_pool", "roi_align")
# Caffe's BGR pixel means, on 0–255 pixels, no std (the weights were trained on these)
CAFFE_PIXEL_MEAN_BGR = (102.9801, 115.9465, 122.7717)


@dataclass(frozen=True)
class ButdConfig:
    backbone: C4Shape
    rpn_hidden: int
    rpn: RpnSettings
    num_classes: int              # object classes + background (index 0)
    num_attributes: int           # attribute classes + "no attribute" (index 0)
    attribute_embed: int          # the class embedding the attribute head concatenates
    attribute_hidden: int
    # "roi_pool": what the public weights were trained with (Caffe's ROIPooling, kept by
    # py-bottom-up-attention's POOLER_TYPE "ROIPool"); "roi_align": detectron2's ROIAlignV2
    # (aligned, adaptive sampling) for weights trained with it
    pooler: str = "roi_pool"
    pooler_resolution: int = 14
    sampling_ratio: int = 0
    aligned: bool = True
    pixel_mean_bgr: tuple[float, float, float] = CAFFE_PIXEL_MEAN_BGR

    def __post_init__(self):
        if self.pooler not in POOLERS:
            raise ValueError(f"butd pooler {self.pooler!r}: expected one of {', '.join(POOLERS)}")


BUTD_SIZES: dict[str, ButdConfig] = {
    # ResNet-101 C4; RPN 3×3 conv of 512 (Caffe's rpn_conv/3x3), 4 sizes × 3 ratios;
    # 1600 Visual Genome objects + background, 400 attributes + none; the attribute head
    # is 2048 + 256 → 512 → 401 (py-bottom-up-attention's FastRCNNOutputLayers)
    "base": ButdConfig(
        backbone=C4Shape(stem=64, res2_out=256, res2_width=64, blocks=(3, 4, 23),
                         res5_blocks=3),
        rpn_hidden=512,
        rpn=RpnSettings(anchor_sizes=(64.0, 128.0, 256.0, 512.0), pre_nms_topk=6000,
                        post_nms_topk=300, nms_threshold=0.7),
        num_classes=1601, num_attributes=401, attribute_embed=256, attribute_hidden=512),
    "tiny": ButdConfig(
        backbone=C4Shape(stem=8, res2_out=16, res2_width=4, blocks=(1, 1, 1),
                         res5_blocks=1),
        rpn_hidden=16,
        rpn=RpnSettings(anchor_sizes=(16.0, 32.0, 64.0), pre_nms_topk=400,
                        post_nms_topk=60, nms_threshold=0.7),
        num_classes=11, num_attributes=5, attribute_embed=4, attribute_hidden=8,
        pooler_resolution=6),
}


def butd_config(size: str) -> ButdConfig:
    try:
        return BUTD_SIZES[size]
    except KeyError:
        raise ValueError(f"butd size {size!r}: unknown; known: {', '.join(BUTD_SIZES)}") from None
