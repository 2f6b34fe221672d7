"""MOC: masked object classification (ImageBERT).

The pipeline masks 15% of the regions and zeroes 90% of those (10% stay as they are); every
masked region — zeroed or kept — is classified as the detector's label. Head: Linear → GELU →
LN → Linear(H, C) (ImageBERT's own, not shared with UNITER's MRC). Loss: CE over masked
regions of true pairs, mean.
"""

from __future__ import annotations

import torch
from torch import nn

from vlp.contract.encoder_output import EncoderOutput
from vlp.tasks.base import Batch, HeadContext, Task, register_task
from vlp.tasks.mrc import RegionClassifier, classification_terms


@register_task
class MaskedObjectClassification(Task):
    name = "moc"
    head_name = "moc"

    def build_head(self, ctx: HeadContext) -> nn.Module:
        return RegionClassifier(ctx)

    def compute(self, head: nn.Module, enc: EncoderOutput, batch: Batch) -> dict[str, torch.Tensor]:
        return classification_terms(self.name, head, enc, batch)
