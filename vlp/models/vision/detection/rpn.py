"""Single-level region proposal network on the C4 map (detectron2's StandardRPNHead layout:
``rpn_head.conv``, ``rpn_head.objectness_logits``, ``rpn_head.anchor_deltas``) and its
test-time proposal selection: the top ``pre_nms_topk`` anchors by objectness, decoded and
clipped to the image, empty boxes dropped, NMS at ``nms_threshold``, the first
``post_nms_topk`` kept."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from vlp.models.vision.detection.anchors import cell_anchors, grid_anchors
from vlp.models.vision.detection.box_coder import BoxCoder, clip_boxes, nonempty
from vlp.models.vision.detection.nms import nms


@dataclass(frozen=True)
class RpnSettings:
    anchor_sizes: tuple[float, ...]
    aspect_ratios: tuple[float, ...] = (0.5, 1.0, 2.0)
    pre_nms_topk: int = 6000
    post_nms_topk: int = 300
    nms_threshold: float = 0.7

    @property
    def num_anchors(self) -> int:
        return len(self.anchor_sizes) * len(self.aspect_ratios)


class RpnHead(nn.Module):
    def __init__(self, cin: int, hidden: int, num_anchors: int):
        super().__init__()
        self.conv = nn.Conv2d(cin, hidden, 3, padding=1)
        self.objectness_logits = nn.Conv2d(hidden, num_anchors, 1)
        self.anchor_deltas = nn.Conv2d(hidden, num_anchors * 4, 1)
        for layer in (self.conv, self.objectness_logits, self.anchor_deltas):
            nn.init.normal_(layer.weight, std=0.01)
            nn.init.zeros_(layer.bias)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = F.relu(self.conv(x))
        return self.objectness_logits(h), self.anchor_deltas(h)


class Rpn(nn.Module):
    """C4 map → proposals (x1y1x2y2 in input pixels), one tensor per image."""

    def __init__(self, cin: int, hidden: int, settings: RpnSettings, stride: int):
        super().__init__()
        self.settings = settings
        self.stride = stride
        self.rpn_head = RpnHead(cin, hidden, settings.num_anchors)
        self.register_buffer("cell_anchors",
                             cell_anchors(settings.anchor_sizes, settings.aspect_ratios),
                             persistent=False)
        self.coder = BoxCoder((1.0, 1.0, 1.0, 1.0))

    def forward(self, c4: torch.Tensor, image_hw: list[tuple[int, int]]) -> list[torch.Tensor]:
        b, _, fh, fw = c4.shape
        logits, deltas = self.rpn_head(c4)
        a = self.settings.num_anchors
        # (B, A, H, W) → (B, H·W·A), location-major like the anchors
        logits = logits.float().permute(0, 2, 3, 1).reshape(b, -1)
        deltas = deltas.float().view(b, a, 4, fh, fw).permute(0, 3, 4, 1, 2).reshape(b, -1, 4)
        anchors = grid_anchors(self.cell_anchors, fh, fw, self.stride)
        k = min(self.settings.pre_nms_topk, logits.shape[1])
        top_logits, top_idx = logits.topk(k, dim=1)                           # sorted
        out = []
        for i, (h, w) in enumerate(image_hw):
            boxes = self.coder.decode(deltas[i, top_idx[i]], anchors[top_idx[i]])
            boxes = clip_boxes(boxes, h, w)
            ok = nonempty(boxes)
            boxes, scores = boxes[ok], top_logits[i][ok]
            keep = nms(boxes, scores, self.settings.nms_threshold,
                       max_keep=self.settings.post_nms_topk)
            out.append(boxes[keep])
        return out
