"""MRFR: regress a masked region's raw input feature (UNITER; also ImageBERT).

Head (UNITER's ``feat_regress``): Linear(H, H) → GELU → LN → a projection to D whose weight is
the image embedder's feature Linear weight, transposed (tied), + its own bias. Target: the
raw feature before masking (not normalised). Loss: MSE, mean over masked regions × D.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from vlp.contract import batch_spec as bs

from vlp.contract.encoder_output import EncoderOutput
from vlp.contract.batch_access import require
from vlp.tasks.base import Batch, HeadContext, Task, masked_regions, register_task, zero_loss


class RegionFeatureRegression(nn.Module):
    def __init__(self, ctx: HeadContext):
        super().__init__()
        projection = getattr(ctx.backbone.visual, "feature_projection", None)
        if projection is None:
            raise ValueError(f"mrfr needs a region family (a feature Linear to tie to); "
                             f"{ctx.backbone.family.name} has none")
        h = ctx.hidden_size
        self.net = nn.Sequential(nn.Linear(h, h), nn.GELU(), nn.LayerNorm(h, eps=ctx.layer_norm_eps))
        self.weight = projection.weight  # [H, D], tied: the same Parameter object
        self.bias = nn.Parameter(torch.zeros(ctx.feat_dim))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return F.linear(self.net(hidden), self.weight.t(), self.bias)


@register_task
class MaskedRegionFeatureRegression(Task):
    name = "mrfr"
    head_name = "mrfr"

    def build_head(self, ctx: HeadContext) -> nn.Module:
        return RegionFeatureRegression(ctx)

    def compute(self, head: nn.Module, enc: EncoderOutput, batch: Batch) -> dict[str, torch.Tensor]:
        select = masked_regions(enc, batch, "mrfr")
        if not select.any():
            return {"mrfr_loss": zero_loss(enc)}
        target = require(batch, bs.REGION_FEAT_TARGETS, "mrfr")[select]
        prediction = head(enc.select_regions(select))
        return {"mrfr_loss": F.mse_loss(prediction.float(), target.float())}
