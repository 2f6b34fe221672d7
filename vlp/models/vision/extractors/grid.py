"""Grid features ("In Defense of Grid Features for VQA", Jiang et al. 2020): a ResNet's C5
map average-pooled to a G×G grid, each cell a region whose box is the cell's share of the
image. No detector: G² regions of confidence 1, and the whole map's mean as the whole-image
feature.

A batch of any sizes is one zero-padded canvas per orientation (padded_batch.py). Padding
alone would change features: the convolutions would read the padded area at each image's
bottom and right border, and the G×G pooling would average padded cells in. So every conv
and pool masks its input to each image's extent, and each image's cells are pooled from its
own part of the C5 map: batched features equal one-at-a-time features (a test checks it on
mixed sizes).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from vlp.models.vision.resnet_config import RESNET101, RESNET_TINY, ResNetConfig
from vlp.models.vision.cnn_weights import cnn_weights_problem, load_cnn_weights
from vlp.models.vision.extractors.base import Extractor, ExtractSettings, file_sha256
from vlp.models.vision.extractors.image_prep import normalised_chw, resize_rgb
from vlp.models.vision.extractors.padded_batch import (canvas, masked_extents,
                                                         orientation_groups)
from vlp.models.vision.resnet import ResNet

RESNET50 = ResNetConfig("bottleneck", (3, 4, 6, 3))
GRID_TRUNKS = {"r50": RESNET50, "r101": RESNET101, "tiny": RESNET_TINY}


class GridExtractor(Extractor):
    def __init__(self, name: str, trunk: ResNet, settings: ExtractSettings,
                 weights_sha256: str | None):
        super().__init__()
        self.name, self.settings, self.weights_sha256 = name, settings, weights_sha256
        self.trunk = trunk.eval()

    def prepare(self, rgb: np.ndarray) -> tuple[np.ndarray, float]:
        """HWC uint8 → (resized HWC uint8, scale); normalised on the model's device."""
        return resize_rgb(rgb, self.settings)

    def cell_boxes(self, h: int, w: int) -> np.ndarray:
        """(G², 4) boxes of the grid cells in an h×w image, row-major like the features."""
        g = self.settings.grid
        xs = np.linspace(0.0, w, g + 1, dtype=np.float64)
        ys = np.linspace(0.0, h, g + 1, dtype=np.float64)
        x1, y1 = np.meshgrid(xs[:-1], ys[:-1])
        x2, y2 = np.meshgrid(xs[1:], ys[1:])
        return np.stack([x1, y1, x2, y2], -1).reshape(-1, 4).astype(np.float32)

    @torch.no_grad()
    def extract(self, inputs: list[torch.Tensor], scales: list[float],
                sizes: list[tuple[int, int]]) -> list[dict[str, np.ndarray | None]]:
        out: list[dict | None] = [None] * len(inputs)
        for idx in orientation_groups(inputs):
            for i, result in zip(idx, self._grid([inputs[i] for i in idx],
                                                 [sizes[i] for i in idx])):
                out[i] = result
        return out    # type: ignore[return-value]

    def _grid(self, inputs: list[torch.Tensor], sizes: list[tuple[int, int]]
              ) -> list[dict[str, np.ndarray | None]]:
        images, resized = canvas(inputs, normalised_chw)
        with masked_extents([self.trunk], resized, tuple(images.shape[-2:])) as extents:
            c5 = self.trunk(images)                                      # [B, C, h5, w5]
            c5_hw = extents.at(c5)
        g = self.settings.grid
        own = [c5[i:i + 1, :, :h, :w] for i, (h, w) in enumerate(c5_hw)]
        cells = torch.cat([F.adaptive_avg_pool2d(x, g) for x in own]).flatten(2).transpose(1, 2)
        whole = torch.cat([x.mean((2, 3)) for x in own])                 # [B, C]
        cells = cells.to(torch.float16).cpu().numpy()   # one copy per canvas
        whole = whole.to(torch.float16).cpu().numpy()
        return [{"boxes": self.cell_boxes(h, w), "confidences": np.ones(g * g, np.float32),
                 "features": cells[i], "soft_labels": None, "image_feature": whole[i]}
                for i, (h, w) in enumerate(sizes)]


def build_grid(weights: str | None, settings: ExtractSettings, size: str = "r50"
               ) -> GridExtractor:
    """``weights``: a torchvision ResNet state dict (local file) or None (random init)."""
    cells = settings.grid ** 2
    if not settings.min_boxes <= cells <= settings.max_boxes:
        raise ValueError(f"grid {settings.grid}×{settings.grid} gives {cells} regions, outside "
                         f"--min-boxes {settings.min_boxes} / --max-boxes {settings.max_boxes}")
    trunk = ResNet(GRID_TRUNKS[size])
    digest = None
    if weights is not None:
        problem = cnn_weights_problem(trunk, weights)
        if problem:
            raise ValueError(problem.replace("model.cnn_init:", "--weights", 1))
        load_cnn_weights(trunk, weights)
        digest = file_sha256(weights)
    return GridExtractor(f"grid-{size}", trunk, settings, digest)
