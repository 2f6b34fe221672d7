"""SOHO embeddings: pixels → ResNet → 1×1 conv → 2×2 max-pool → visual dictionary → tokens.

visual token = LN( VD(v) + 2-D sine position + token_type(1) ), dropout. The order of the
conv and the pool is the paper's (§3.1: "ResNet … followed by a 1×1 convolutional layer and
a 2×2 max pooling layer"); the two do not commute (the max is taken over projected
features, so each cell keeps the strongest response per output channel). Each image is
encoded once and its tokens are gathered for every text paired with it (``image_index``).
For MVM the embedder picks, on each image with ``mvm_apply``, one dictionary index present in
the image uniformly at random, replaces every cell mapped to it by a learned [MASK]
embedding and records the index as those cells' label. Joint masking's MLM batches carry
``mvm_apply`` too, and are masked the same way.

Under the summed objective one example set is forwarded once per task, each task's batch
holding the same images (``summed_batch`` checks it): inside ``images_encoded_once`` the
first forward's ResNet → dictionary output is kept and the other tasks reuse it, so each
image goes through the CNN and the dictionary once per micro-batch, as in the paper (Eq. 9
on one forward of the image); the CNN's gradient is the sum of every task's.

Finetuning (``set_finetune_input``): SOHO §4.2, "using input features of the VD module for
visual representation is better than directly applying VD embedding. We adopt the former":
with ``tokens = "features"`` the visual tokens are built from the grid features that enter
the dictionary (its quantised output is then only read for the usage figures); with
``"dictionary"`` from its quantised output, as in pre-training. ``dictionary_updates=False``
freezes the entries (no moving average, no initialisation) for the finetune.

Every forward also reports the dictionary's usage on the batch's images (``vd_used``: the
share of entries some valid cell maps to; ``vd_perplexity``: exp of the entropy of the
cells' index distribution; ``vd_indices_per_image``: distinct indices per image, mean), so a
collapsing dictionary shows in every report.
"""

from __future__ import annotations

from typing import Mapping

import torch
import torch.nn.functional as F
from torch import nn

from vlp.contract import batch_spec as bs

from vlp.contract.batch_access import BatchError, require
from vlp.models.family_config import SohoVisualConfig, TransformerConfig
from vlp.models.vision.position_2d import sine_position_2d
from vlp.models.vision.resnet import ResNet
from vlp.models.vision.visual_dictionary import VisualDictionary
from vlp.models.embeddings.embedded_inputs import METRIC_PREFIX, EmbeddedInputs
from vlp.models.embeddings.text import TextEmbeddings

from vlp.contract.encoder_output import MVM_LABELS  # noqa: E402  (re-exported)


TOKEN_SOURCES = ("features", "dictionary")


class SohoEmbedder(nn.Module):
    def __init__(self, cfg: TransformerConfig, visual: SohoVisualConfig, feat_dim: int):
        super().__init__()
        h = cfg.hidden_size
        self.resnet = ResNet(visual.resnet)
        self.proj = nn.Conv2d(self.resnet.out_channels, h, 1)
        self.pool = nn.MaxPool2d(2, stride=2, ceil_mode=True)  # keep the last odd row/column
        self.dictionary = VisualDictionary(visual.dictionary_size, h, visual.dictionary_momentum,
                                           visual.dictionary_init)
        self.mask_token = nn.Parameter(torch.zeros(h))  # MVM's [MASK] embedding
        self.LayerNorm = nn.LayerNorm(h, eps=cfg.layer_norm_eps)
        self.dropout = nn.Dropout(cfg.hidden_dropout)
        # SOHO's cold start (vlp/platform/training/cnn_recipe.py sets it): the ResNet runs without
        # autograd while frozen; its BatchNorm statistics still follow the data
        self.cnn_frozen = False
        self.shared_images: dict | None = None   # images_encoded_once's cache (a dict there)
        self.tokens = "dictionary"   # what the visual tokens are built from (see the module)

    def init_extra_(self, std: float) -> None:
        nn.init.normal_(self.mask_token, std=std)
        nn.init.kaiming_normal_(self.proj.weight, mode="fan_out", nonlinearity="relu")
        nn.init.zeros_(self.proj.bias)

    def set_finetune_input(self, tokens: str = "features",
                           dictionary_updates: bool = False) -> None:
        """SOHO's finetuning input (see the module): ``features`` | ``dictionary``."""
        if tokens not in TOKEN_SOURCES:
            raise ValueError(f"SOHO visual tokens {tokens!r}: expected one of {TOKEN_SOURCES}")
        self.tokens = tokens
        self.dictionary.frozen = not dictionary_updates

    def encode_images(self, pixels: torch.Tensor, pixel_mask: torch.Tensor | None
                      ) -> tuple[torch.Tensor, torch.Tensor, tuple[int, int]]:
        """[I, 3, H, W] → grid features [I, n, H] (before the dictionary), valid [I, n],
        (h, w)."""
        if self.cnn_frozen and torch.is_grad_enabled():
            with torch.no_grad():
                trunk = self.resnet(pixels)
        else:
            trunk = self.resnet(pixels)
        grid = self.pool(self.proj(trunk))
        i, _, h, w = grid.shape
        if pixel_mask is None:
            valid = torch.ones(i, h, w, dtype=torch.bool, device=grid.device)
        else:  # a cell is real where its (nearest) pixel is, as in DETR
            valid = F.interpolate(pixel_mask[:, None].float(), size=(h, w)).bool()[:, 0]
        return grid.flatten(2).transpose(1, 2), valid.flatten(1), (h, w)

    def quantised_images(self, pixels: torch.Tensor, pixel_mask: torch.Tensor | None):
        """(grid, valid, (h, w), quantised, indices): encoded here, or inside
        ``images_encoded_once`` taken from the first forward of the example set."""
        kept = self.shared_images.get("images") if self.shared_images is not None else None
        if kept is not None and kept[0] == tuple(pixels.shape):
            return kept[1]
        grid, valid, hw = self.encode_images(pixels, pixel_mask)
        out = (grid, valid, hw, *self.dictionary(grid, valid))
        if self.shared_images is not None:
            self.shared_images["images"] = (tuple(pixels.shape), out)
        return out

    def usage(self, indices: torch.Tensor, valid: torch.Tensor) -> dict[str, torch.Tensor]:
        """The dictionary's usage on these images (device tensors: no host sync)."""
        k = self.dictionary.size
        cells = torch.where(valid, indices, k)
        # a scatter-add, not bincount: bincount sizes its output by the largest index, which
        # it reads from the device
        flat = cells.flatten()
        counts = torch.zeros(k + 1, dtype=torch.long, device=flat.device).scatter_add_(
            0, flat, torch.ones_like(flat))[:k].float()
        p = counts / counts.sum().clamp(min=1)
        entropy = -(p * p.clamp(min=1e-12).log()).sum()
        present = torch.zeros(indices.shape[0], k + 1, dtype=torch.bool, device=indices.device)
        present.scatter_(1, cells, True)
        return {"vd_used": (counts > 0).float().mean(), "vd_perplexity": entropy.exp(),
                "vd_indices_per_image": present[:, :k].sum(1).float().mean()}

    def mask_one_index(self, indices: torch.Tensor, valid: torch.Tensor,
                       apply: torch.Tensor) -> torch.Tensor:
        """bool [I, n]: on each image with ``apply``, every real cell mapped to one index
        drawn uniformly among the indices present in that image (SOHO: masking a single cell
        would let the model copy the label from its same-index neighbours)."""
        k = self.dictionary.size
        present = torch.zeros(indices.shape[0], k + 1, dtype=torch.bool, device=indices.device)
        present.scatter_(1, torch.where(valid, indices, k), True)
        present = present[:, :k]
        score = torch.rand(present.shape, device=indices.device).masked_fill(~present, -1.0)
        chosen = score.argmax(1)
        apply = apply.bool() & present.any(1)
        return (indices == chosen[:, None]) & valid & apply[:, None]

    def forward(self, batch: Mapping[str, torch.Tensor], text: TextEmbeddings,
                visual_masking: bool = False) -> EmbeddedInputs:
        who = "SOHO embeddings"
        if bs.REGION_TYPE_IDS in batch:  # grid cells are embedded per image, before the gather
            raise BatchError(f"{who}: per-token visual types ({bs.REGION_TYPE_IDS!r}) are not "
                             "supported (one image per example; NLVR2 needs the pair variants)")
        pixels = require(batch, bs.PIXELS, who).to(self.proj.weight.dtype)
        image_index = require(batch, bs.IMAGE_INDEX, who).long()
        grid, valid, (h, w), quantised, indices = self.quantised_images(
            pixels, batch.get(bs.PIXEL_MASK))
        extras = {METRIC_PREFIX + name: v for name, v in self.usage(indices, valid).items()}
        # the VD module's input (finetuning, §4.2) or its quantised output (pre-training)
        cells = grid if self.tokens == "features" else quantised
        if visual_masking:
            masked = self.mask_one_index(indices, valid, require(batch, bs.MVM_APPLY, who))
            cells = torch.where(masked.unsqueeze(-1), self.mask_token.to(cells.dtype), cells)
            labels = torch.where(masked, indices, torch.full_like(indices, -100))
            extras[MVM_LABELS] = labels[image_index]
        position = sine_position_2d(valid.view(-1, h, w), cells.shape[-1])
        tokens = self.LayerNorm(cells + position.flatten(1, 2).to(cells.dtype)
                                + text.token_type(1))
        tokens = self.dropout(tokens)[image_index]
        return EmbeddedInputs(
            text=text(require(batch, bs.INPUT_IDS, who),
                      token_type=batch.get(bs.TEXT_TYPE_IDS, 0)),
            text_mask=require(batch, bs.TEXT_MASK, who).bool(),
            visual=tokens,
            visual_mask=valid[image_index],
            num_regions=tokens.shape[1],
            extras=extras,
        )
