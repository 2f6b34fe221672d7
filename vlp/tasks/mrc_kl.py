"""MRC-kl: distil the detector's class distribution into masked regions (UNITER).

Masking: MRC's, with the detector's distribution as the target. Same head as MRC
(``region_classifier``). Loss: KL(detector ‖ softmax(prediction)) over all C classes
(background included).

Normalisation: we sum the KL over the C classes of a region — the true KL divergence of that
region, as in the paper's Σ_i D_KL — and average over the masked regions of true pairs. The
reference code averages over regions × classes, i.e. its loss is ours divided by C (1601);
multiply a mix weight by 1/C to reproduce its scale.
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
from vlp.tasks.masking_visual import SOFT_LABELS, choose_regions, zero_regions
from vlp.tasks.mrc import RegionClassifier
from vlp.tasks.registry import register
from vlp.tasks.spec import ArrayBatch, Batch, HeadContext, MaskContext, Task


@register
class MaskedRegionClassificationKL(Task):
    name, label, order = "mrc-kl", "MRC-kl", 3
    head_name = "region_classifier"  # shared with mrc, as in UNITER
    modality = "regions"
    visual = frozenset({"regions"})
    families = frozenset({"uniter"})
    needs_soft_labels = True

    def mask(self, batch: ArrayBatch, rng: np.random.Generator, ctx: MaskContext) -> None:
        masked = choose_regions(batch, rng, ctx)
        zero_regions(batch, masked)
        batch[bs.REGION_MASKED] = masked
        batch[bs.REGION_SOFT_LABELS] = batch[SOFT_LABELS]

    def build_head(self, ctx: HeadContext) -> nn.Module:
        return RegionClassifier(ctx)

    def compute(self, head: nn.Module, enc: EncoderOutput, batch: Batch) -> dict[str, torch.Tensor]:
        targets = region_targets(enc, batch, self.name)   # [2, M], M known on the host
        if targets.shape[1] == 0:
            return {"mrc-kl_loss": zero_loss(enc)}
        soft = require(batch, bs.REGION_SOFT_LABELS, self.name)
        target = soft[targets[0], targets[1]].float()
        log_prediction = F.log_softmax(head(enc.regions_at(targets)).float(), dim=-1)
        # kl_div(log q, p) = p (log p − log q), 0 where p = 0; sum over classes, mean over regions
        kl = F.kl_div(log_prediction, target, reduction="none").sum(-1)   # per region
        return {"mrc-kl_loss": weighted_mean(kl, target_valid(batch, bs.REGION_TARGETS))}
