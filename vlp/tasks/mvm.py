"""MVM: masked visual modeling on the visual dictionary (SOHO).

Masking by visual-dictionary index happens inside the model (``masks_visual_tokens``: the
index exists only after the dictionary lookup); the pipeline only flags the images to mask
(``masking_visual.flag_mvm_images``). The embedder masks, on each image with ``mvm_apply``,
every cell mapped to one dictionary index present in the image, and labels those cells with
that index. Head: Linear → GELU → LN,
then cosine similarity to every (detached) dictionary entry, times a learned logit scale
(init 10, capped at 100: raw cosines in [−1, 1] are too flat a softmax over 2048 classes).
Loss: CE over masked cells of true pairs, mean.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from vlp.contract.batch_access import positive_pairs
from vlp.contract.encoder_output import MVM_LABELS, EncoderOutput
from vlp.tasks.masking_visual import flag_mvm_images
from vlp.tasks.mlm import PredictionTransform
from vlp.tasks.registry import register
from vlp.tasks.spec import ArrayBatch, Batch, HeadContext, MaskContext, Task

MAX_LOGIT_SCALE = 100.0


class VisualDictionaryHead(nn.Module):
    def __init__(self, ctx: HeadContext):
        super().__init__()
        dictionary = getattr(ctx.backbone.visual, "dictionary", None)
        if dictionary is None:
            raise ValueError(f"mvm needs a visual dictionary; {ctx.backbone.family.name} has none")
        self.dictionary = [dictionary]  # a plain list: a reference, not a second registration
        self.transform = PredictionTransform(ctx.hidden_size, ctx.layer_norm_eps)
        # shape [1], not a 0-d scalar: DeepSpeed broadcasts every parameter as bytes
        # (``p.view(torch.uint8)``), which a 0-d tensor cannot be viewed as
        self.log_logit_scale = nn.Parameter(torch.tensor([math.log(10.0)]))

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        key = prefix + "log_logit_scale"
        if key in state_dict and state_dict[key].dim() == 0:   # checkpoints of the 0-d scale
            state_dict[key] = state_dict[key].reshape(1)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        entries = F.normalize(self.dictionary[0].embedding.detach().float(), dim=-1)
        outputs = F.normalize(self.transform(hidden).float(), dim=-1)
        scale = self.log_logit_scale.exp().clamp(max=MAX_LOGIT_SCALE)
        return scale * outputs @ entries.t()


@register
class MaskedVisualModeling(Task):
    name, label, order = "mvm", "MVM", 7
    head_name = "mvm"
    modality = "pixels"
    visual = frozenset({"pixels"})
    families = frozenset({"soho"})
    masks_visual_tokens = True

    def mask(self, batch: ArrayBatch, rng: np.random.Generator, ctx: MaskContext) -> None:
        flag_mvm_images(batch, rng, ctx)

    def build_head(self, ctx: HeadContext) -> nn.Module:
        return VisualDictionaryHead(ctx)

    def compute(self, head: nn.Module, enc: EncoderOutput, batch: Batch) -> dict[str, torch.Tensor]:
        labels = enc.extras[MVM_LABELS]
        positive = positive_pairs(batch, labels.shape[0], labels.device)
        select = (labels != -100) & enc.region_mask & positive[:, None]
        # the masked cells are known only on the device (the dictionary lookup picks them), so
        # the head runs on every cell and the loss is the mean over the selected ones: no read
        # of how many there are, no boolean index (each would make the host wait)
        logits = head(enc.region_output())                                   # [B, N, K]
        ce = F.cross_entropy(logits.flatten(0, 1), labels.clamp(min=0).flatten(),
                             reduction="none").view_as(labels)
        count = select.sum().clamp(min=1)
        hit = (logits.detach().argmax(-1) == labels) & select
        return {"mvm_loss": torch.where(select, ce, 0.0).sum() / count,
                "mvm_acc": hit.sum() / count}
