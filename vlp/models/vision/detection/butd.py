"""``butd-r101-c4`` (and ``butd-tiny``): BUTD's detector as a registered extractor.

Per image: regions chosen by BUTD's rule (region_select.py) among the RPN's proposals,
their mean-pooled res5 features (fp16), the softmax over all classes as soft labels (the
MRC / MRC-kl targets), and one whole-image RoI through the same head (VL-BERT's visual
feature for text tokens). Boxes are the RoIs as proposed, not regressed, mapped back to the
original image's pixels.

Images are batched only with images of the same resized size (BUTD's resize gives every
image of one aspect ratio the same size, so COCO's two orientations form two buckets):
nothing is padded, each image's RoIs carry its batch index into RoIAlign, and a batch's
features equal those of its images run one at a time.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import torch
from PIL import Image

from vlp.models.vision.detection.butd_config import butd_config
from vlp.models.vision.detection.butd_convert import load_butd_weights
from vlp.models.vision.detection.butd_model import ButdDetector
from vlp.models.vision.detection.region_select import select_regions
from vlp.models.vision.extractors.base import Extractor, ExtractSettings, resized_hw

NAMES = {"base": "butd-r101-c4", "tiny": "butd-tiny"}


class ButdExtractor(Extractor):
    def __init__(self, detector: ButdDetector, settings: ExtractSettings, name: str,
                 weights_sha256: str | None):
        super().__init__()
        self.detector = detector.eval()
        self.settings = settings
        self.name = name
        self.weights_sha256 = weights_sha256
        # host copies: prepare() runs in CPU workers and must not touch the model's device
        self._pixel_mean = detector.pixel_mean.detach().cpu().numpy().astype(np.float32)
        self._pixel_std = detector.pixel_std.detach().cpu().numpy().astype(np.float32)

    def prepare(self, rgb: np.ndarray) -> tuple[np.ndarray, float]:
        """HWC uint8 RGB → CHW float32 BGR less the Caffe means (the weights' input), with
        the shorter side at ``short_side`` unless the longer would pass ``long_side``."""
        h, w = rgb.shape[:2]
        rh, rw, scale = resized_hw(h, w, self.settings)
        if (rh, rw) != (h, w):
            rgb = np.asarray(Image.fromarray(rgb).resize((rw, rh), Image.BILINEAR))
        bgr = rgb[:, :, ::-1].astype(np.float32)
        chw = ((bgr - self._pixel_mean) / self._pixel_std).transpose(2, 0, 1)
        return np.ascontiguousarray(chw), scale

    def _autocast_dtype(self, device: torch.device) -> torch.dtype | None:
        # fp16 on GPUs (tensor cores; the stored features are fp16 anyway); fp32 on CPU
        return torch.float16 if device.type == "cuda" else None

    @torch.no_grad()
    def extract(self, inputs: list[torch.Tensor], scales: list[float],
                sizes: list[tuple[int, int]]) -> list[dict[str, np.ndarray | None]]:
        buckets: dict[tuple[int, ...], list[int]] = defaultdict(list)
        for i, x in enumerate(inputs):
            buckets[tuple(x.shape)].append(i)
        out: list[dict | None] = [None] * len(inputs)
        for members in buckets.values():
            batch = torch.stack([inputs[i] for i in members])
            for i, result in zip(members, self._detect(batch, [scales[i] for i in members],
                                                       [sizes[i] for i in members])):
                out[i] = result
        return out    # type: ignore[return-value]

    def _detect(self, batch: torch.Tensor, scales: list[float],
                sizes: list[tuple[int, int]]) -> list[dict[str, np.ndarray]]:
        s = self.settings
        proposals, pooled, probs = self.detector(batch, self._autocast_dtype(batch.device))
        results, row = [], 0
        for boxes, scale, (h, w) in zip(proposals, scales, sizes):
            n = boxes.shape[0]
            feats, p = pooled[row:row + n], probs[row:row + n]
            image_feature = pooled[row + n]
            row += n + 1
            idx, conf = select_regions(boxes, p[:, 1:], s.nms_threshold, s.conf_threshold,
                                       s.min_boxes, s.max_boxes)
            kept = boxes[idx].float() / scale
            limits = torch.tensor([w, h, w, h], dtype=kept.dtype, device=kept.device)
            kept = torch.minimum(kept.clamp(min=0), limits)
            results.append({
                "boxes": kept.cpu().numpy().astype(np.float32),
                "confidences": conf.float().cpu().numpy(),
                "features": feats[idx].half().cpu().numpy(),
                "soft_labels": p[idx].float().cpu().numpy(),
                "image_feature": image_feature.half().cpu().numpy(),
            })
        return results


def build_butd(weights: str | None, settings: ExtractSettings, size: str = "base"
               ) -> ButdExtractor:
    """The BUTD extractor: random weights when ``weights`` is None, else the detectron2-format
    checkpoint at that local path (.pkl / .pth / .pt), checked key by key (ValueError, one
    line per problem, when it does not fit)."""
    problems = settings.problems()
    if problems:
        raise ValueError("; ".join(problems))
    cfg = butd_config(size)
    if weights is None:
        detector = ButdDetector(cfg)
        detector.reset_random()
        sha = None
    else:
        detector, sha = load_butd_weights(weights, cfg)
    return ButdExtractor(detector, settings, NAMES[size], sha)
