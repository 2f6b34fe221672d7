"""MOC: masked object classification (ImageBERT).

The pipeline masks 15% of the regions and zeroes 90% of those (BERT's "unchanged" share: 10%
keep their feature); every masked region — zeroed or kept — is classified as the detector's
label. Head: Linear → GELU → LN → Linear(H, C) (ImageBERT's own, not shared with UNITER's
MRC). Loss: CE over masked regions of true pairs, mean.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from vlp.contract.encoder_output import EncoderOutput
from vlp.contract import batch_spec as K
from vlp.tasks.masking_visual import choose_regions, hard_labels, mask_with_hard_labels
from vlp.tasks.mrc import RegionClassifier, classification_terms
from vlp.tasks.registry import register
from vlp.tasks.spec import ArrayBatch, Batch, HeadContext, MaskContext, Task

ZERO_SHARE = 0.9


@register
class MaskedObjectClassification(Task):
    name, label, order = "moc", "MOC", 5
    head_name = "moc"
    modality = "regions"
    visual = frozenset({"regions"})
    families = frozenset({"imagebert"})
    needs_soft_labels = True

    def mask(self, batch: ArrayBatch, rng: np.random.Generator, ctx: MaskContext) -> None:
        masked = choose_regions(batch, rng, ctx)
        mask_with_hard_labels(batch, masked, masked & (rng.random(masked.shape) < ZERO_SHARE))

    def share_mask(self, batch: ArrayBatch, raw_feats: np.ndarray) -> None:
        """ImageBERT writes MOC and MRFR over one masked set m_I (§4.3): classify the regions
        MRFR masked."""
        batch[K.REGION_CLASS_LABELS] = hard_labels(batch, batch[K.REGION_MASKED])

    def build_head(self, ctx: HeadContext) -> nn.Module:
        return RegionClassifier(ctx)

    def compute(self, head: nn.Module, enc: EncoderOutput, batch: Batch) -> dict[str, torch.Tensor]:
        return classification_terms(self.name, head, enc, batch)
