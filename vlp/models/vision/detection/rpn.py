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

    def forward(self, c4: torch.Tensor, image_hw: list[tuple[int, int]],
                feature_hw: list[tuple[int, int]] | None = None) -> list[torch.Tensor]:
        """``image_hw``: each image's own (h, w) in input pixels; ``feature_hw``: its extent
        on ``c4`` when the batch is a padded canvas (padded_batch.py): anchors exist only
        there, as for the image alone (default: the whole map)."""
        b, _, fh, fw = c4.shape
        logits, deltas = self.rpn_head(c4)
        a = self.settings.num_anchors
        logits = logits.float()
        deltas = deltas.float().view(b, a, 4, fh, fw)
        anchors_by_hw: dict[tuple[int, int], torch.Tensor] = {}
        out = []
        for i, (h, w) in enumerate(image_hw):
            eh, ew = feature_hw[i] if feature_hw is not None else (fh, fw)
            if (eh, ew) not in anchors_by_hw:
                anchors_by_hw[(eh, ew)] = grid_anchors(self.cell_anchors, eh, ew, self.stride)
            anchors = anchors_by_hw[(eh, ew)]
            # (A, H, W) → (H·W·A,), location-major like the anchors
            li = logits[i, :, :eh, :ew].permute(1, 2, 0).reshape(-1)
            di = deltas[i, :, :, :eh, :ew].permute(2, 3, 0, 1).reshape(-1, 4)
            k = min(self.settings.pre_nms_topk, li.shape[0])
            top_logits, top_idx = li.topk(k)                                  # sorted
            boxes = self.coder.decode(di[top_idx], anchors[top_idx])
            boxes = clip_boxes(boxes, h, w)
            ok = nonempty(boxes)
            boxes, scores = boxes[ok], top_logits[ok]
            keep = nms(boxes, scores, self.settings.nms_threshold,
                       max_keep=self.settings.post_nms_topk)
            out.append(boxes[keep])
        return out
