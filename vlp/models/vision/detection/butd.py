"""``butd-r101-c4`` (and ``butd-tiny``): BUTD's detector as a registered extractor.

Per image: regions chosen by BUTD's rule (region_select.py) among the RPN's proposals,
their mean-pooled res5 features (fp16), the softmax over all classes as soft labels (the
MRC / MRC-kl targets), and one whole-image RoI through the same head (VL-BERT's visual
feature for text tokens). Boxes are the RoIs as proposed, not regressed, mapped back to the
original image's pixels.

A batch of any sizes is one zero-padded canvas per orientation (padded_batch.py: landscape
and portrait images in one canvas would pad it square): the padding comes after
normalisation, every conv and pool of the trunk and the RPN reads zeros outside each image's
extent, anchors exist only over each image's own part of the C4 map, proposals are clipped to
its own size and its RoIs pool from its own part: a batch's features equal those of its
images run one at a time (a test checks it on mixed sizes and aspects).

Given boxes (``extract(..., boxes=...)``, ``vlp data extract --boxes``: e.g. MAttNet's
detections for RefCOCO+ val^d): each image's boxes, in its original pixels, are scaled with
the image's resize (the one number its own boxes are divided by) and pooled in place of the
RPN's proposals: no RPN, no NMS, no confidence filter, every box kept in its order. The head
still gives the soft labels; a box's confidence is its highest object-class probability
(BUTD's confidence without the per-class NMS). The written boxes are the given ones, as
given.
"""

from __future__ import annotations

import numpy as np
import torch

from vlp.models.vision.detection.butd_config import butd_config
from vlp.models.vision.detection.butd_convert import load_butd_weights
from vlp.models.vision.detection.butd_model import ButdDetector
from vlp.models.vision.detection.region_select import select_regions
from vlp.models.vision.extractors.base import Extractor, ExtractSettings
from vlp.models.vision.extractors.image_prep import resize_rgb
from vlp.models.vision.extractors.padded_batch import canvas, orientation_groups

NAMES = {"base": "butd-r101-c4", "tiny": "butd-tiny"}


class ButdExtractor(Extractor):
    takes_boxes = True

    def __init__(self, detector: ButdDetector, settings: ExtractSettings, name: str,
                 weights_sha256: str | None):
        super().__init__()
        self.detector = detector.eval()
        self.settings = settings
        self.name = name
        self.weights_sha256 = weights_sha256

    def prepare(self, rgb: np.ndarray) -> tuple[np.ndarray, float]:
        """HWC uint8 RGB → (HWC uint8 RGB resized: shorter side to ``short_side`` unless the
        longer would pass ``long_side``, scale). Normalisation runs on the model's device
        (``_normalise``): a quarter of the bytes of a float image through the object store."""
        return resize_rgb(rgb, self.settings)

    def _normalise(self, x: torch.Tensor) -> torch.Tensor:
        """HWC uint8 RGB on the device → CHW float32 BGR less the Caffe means (the weights'
        input)."""
        mean = self.detector.pixel_mean.float()[:, None, None]
        std = self.detector.pixel_std.float()[:, None, None]
        return (x.flip(-1).permute(2, 0, 1).float() - mean) / std

    def _autocast_dtype(self, device: torch.device) -> torch.dtype | None:
        # fp16 on GPUs (tensor cores; the stored features are fp16 anyway); fp32 on CPU
        return torch.float16 if device.type == "cuda" else None

    @torch.no_grad()
    def extract(self, inputs: list[torch.Tensor], scales: list[float],
                sizes: list[tuple[int, int]], boxes: list[np.ndarray] | None = None
                ) -> list[dict[str, np.ndarray | None]]:
        out: list[dict | None] = [None] * len(inputs)
        for idx in orientation_groups(inputs):
            images, resized = canvas([inputs[i] for i in idx], self._normalise)
            given = None if boxes is None else [boxes[i] for i in idx]
            for i, result in zip(idx, self._detect(images, resized, [scales[i] for i in idx],
                                                   [sizes[i] for i in idx], given)):
                out[i] = result
        return out    # type: ignore[return-value]

    def _detect(self, batch: torch.Tensor, resized: list[tuple[int, int]], scales: list[float],
                sizes: list[tuple[int, int]], given: list[np.ndarray] | None = None
                ) -> list[dict[str, np.ndarray]]:
        s = self.settings
        # given boxes (original pixels) → the resized image's pixels, as the RPN's are
        rois = None if given is None else [
            torch.from_numpy(np.array(b, np.float32)).to(batch.device) * scale
            for b, scale in zip(given, scales)]
        proposals, pooled, probs = self.detector(batch, self._autocast_dtype(batch.device),
                                                 resized, rois)
        results, row = [], 0
        for k, (boxes, scale, (h, w)) in enumerate(zip(proposals, scales, sizes)):
            n = boxes.shape[0]
            feats, p = pooled[row:row + n], probs[row:row + n]
            image_feature = pooled[row + n]
            row += n + 1
            if given is not None:
                results.append({
                    "boxes": np.asarray(given[k], np.float32).reshape(n, 4),
                    "confidences": p[:, 1:].amax(dim=1).float().cpu().numpy(),
                    "features": feats.half().cpu().numpy(),
                    "soft_labels": p.float().cpu().numpy(),
                    "image_feature": image_feature.half().cpu().numpy(),
                })
                continue
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
