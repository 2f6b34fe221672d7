"""MRFR: regress a masked region's raw input feature (UNITER; also ImageBERT).

Masking: UNITER's region masking (see ``mrc.py``), the raw features kept as targets. Head (UNITER's
``feat_regress``): Linear(H, H) → GELU → LN → a projection to D whose weight is
the image embedder's feature Linear weight, transposed (tied), + its own bias. Target: the
raw feature before masking (not normalised).

Loss, by the family's ``mrfr_reduction`` (``model.mrfr_reduction`` in a run's config):

- ``sum-features`` (the default; the papers'): Σ_d (h − r)² per masked region, the mean over
  the masked regions — UNITER §3.2 "Σᵢ ‖h_θ(v_m⁽ⁱ⁾) − r(v_m⁽ⁱ⁾)‖²₂", ImageBERT §4.3 the same
  sum of squared L2 distances. MRC-kl's KL is summed over classes the same way, so the two
  region losses keep the papers' relative weight.
- ``mean-elements``: the reference code's ``F.mse_loss``, the mean over masked regions × D:
  D times smaller (2,048× at BUTD's width).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from vlp.contract import batch_spec as bs
from vlp.contract.batch_access import require
from vlp.contract.encoder_output import EncoderOutput
from vlp.tasks.losses import region_targets, target_valid, weighted_mean, zero_loss
from vlp.tasks.masking_visual import choose_regions, zero_regions
from vlp.tasks.registry import register
from vlp.tasks.spec import ArrayBatch, Batch, HeadContext, MaskContext, Task


REDUCTIONS = ("sum-features", "mean-elements")


def mrfr_loss(prediction: torch.Tensor, target: torch.Tensor, reduction: str,
              valid: torch.Tensor | None = None) -> torch.Tensor:
    """[M, D] predictions and raw targets of M masked regions → the scalar loss (module
    docstring), in fp32; ``valid`` (bool [M]) keeps a fixed-shape batch's padding targets out
    of the mean over regions."""
    squared = (prediction.float() - target.float()).square()
    if reduction == "sum-features":
        per_region = squared.sum(-1)
    elif reduction == "mean-elements":
        per_region = squared.mean(-1)     # every region has D elements: the mean of means
    else:
        raise ValueError(f"mrfr_reduction={reduction!r}: expected one of "
                         f"{', '.join(REDUCTIONS)}")
    return weighted_mean(per_region, valid)


class RegionFeatureRegression(nn.Module):
    def __init__(self, ctx: HeadContext):
        super().__init__()
        self.reduction = ctx.backbone.family.mrfr_reduction
        projection = getattr(ctx.backbone.visual, "feature_projection", None)
        if projection is None:
            raise ValueError(f"mrfr needs a region family (a feature Linear to tie to); "
                             f"{ctx.backbone.family.name} has none")
        h = ctx.hidden_size
        self.net = nn.Sequential(nn.Linear(h, h), nn.GELU(),
                                 nn.LayerNorm(h, eps=ctx.layer_norm_eps))
        self.weight = projection.weight  # [H, D], tied: the same Parameter object
        self.bias = nn.Parameter(torch.zeros(ctx.feat_dim))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return F.linear(self.net(hidden), self.weight.t(), self.bias)


@register
class MaskedRegionFeatureRegression(Task):
    name, label, order = "mrfr", "MRFR", 4
    head_name = "mrfr"
    modality = "regions"
    visual = frozenset({"regions"})
    families = frozenset({"uniter", "imagebert"})

    def mask(self, batch: ArrayBatch, rng: np.random.Generator, ctx: MaskContext) -> None:
        masked = choose_regions(batch, rng, ctx)
        batch[bs.REGION_FEAT_TARGETS] = batch[bs.REGION_FEATS].copy()   # raw, not normalised
        zero_regions(batch, masked)
        batch[bs.REGION_MASKED] = masked

    def share_mask(self, batch: ArrayBatch, raw_feats: np.ndarray) -> None:
        """Regress the regions another task of the group masked (ImageBERT: MOC's m_I)."""
        batch[bs.REGION_FEAT_TARGETS] = raw_feats

    def build_head(self, ctx: HeadContext) -> nn.Module:
        return RegionFeatureRegression(ctx)

    def compute(self, head: nn.Module, enc: EncoderOutput, batch: Batch) -> dict[str, torch.Tensor]:
        targets = region_targets(enc, batch, "mrfr")   # [2, M], its size known on the host
        if targets.shape[1] == 0:
            return {"mrfr_loss": zero_loss(enc)}
        target = require(batch, bs.REGION_FEAT_TARGETS, "mrfr")[targets[0], targets[1]]
        prediction = head(enc.regions_at(targets))
        return {"mrfr_loss": mrfr_loss(prediction, target, head.reduction,
                                       target_valid(batch, bs.REGION_TARGETS))}
