"""MLM: predict masked words from the rest of the text and the whole image (UNITER, BERT);
all four families.

Masking: BERT's (``masking_text.mask_text``). Head (BERT's ``cls.predictions``): dense →
GELU → LN → decoder whose weight *is* the word embedding matrix (tied) + its own bias.
Loss: CE over masked positions of true pairs, mean.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from vlp.contract import batch_spec as bs
from vlp.contract.batch_access import require
from vlp.contract.encoder_output import EncoderOutput
from vlp.tasks.losses import (accuracy, target_valid, text_targets, weighted_mean,
                              zero_loss)
from vlp.tasks.masking_text import mask_text
from vlp.tasks.registry import register
from vlp.tasks.spec import ArrayBatch, Batch, HeadContext, MaskContext, Task


class PredictionTransform(nn.Module):
    def __init__(self, hidden: int, eps: float):
        super().__init__()
        self.dense = nn.Linear(hidden, hidden)
        self.transform_act_fn = nn.GELU()
        self.LayerNorm = nn.LayerNorm(hidden, eps=eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.transform_act_fn(self.dense(x)))


class MaskedLanguageHead(nn.Module):
    def __init__(self, ctx: HeadContext):
        super().__init__()
        words = ctx.backbone.text_embeddings.word_embeddings
        self.transform = PredictionTransform(ctx.hidden_size, ctx.layer_norm_eps)
        self.decoder = nn.Linear(ctx.hidden_size, ctx.vocab_size, bias=False)
        self.decoder.weight = words.weight  # tied: the same Parameter object
        self.bias = nn.Parameter(torch.zeros(ctx.vocab_size))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.transform(hidden)) + self.bias


@register
class MaskedLanguageModeling(Task):
    name, label, order = "mlm", "MLM", 0
    head_name = "mlm"
    modality = "text"
    visual = frozenset({"regions", "pixels"})

    def mask(self, batch: ArrayBatch, rng: np.random.Generator, ctx: MaskContext) -> None:
        mask_text(batch, rng, ctx)

    def build_head(self, ctx: HeadContext) -> nn.Module:
        return MaskedLanguageHead(ctx)

    def compute(self, head: nn.Module, enc: EncoderOutput, batch: Batch) -> dict[str, torch.Tensor]:
        labels = require(batch, bs.MLM_LABELS, "mlm")
        targets = text_targets(enc, batch, labels)   # [2, M], its size known on the host
        # keys named by the task, so mlm-obj and mlm-text (same head and loss) report their own
        loss, acc = f"{self.name}_loss", f"{self.name}_acc"
        if targets.shape[1] == 0:
            return {loss: zero_loss(enc), acc: zero_loss(enc).detach()}
        logits = head(enc.text_at(targets))
        target = labels[targets[0], targets[1]]
        valid = target_valid(batch, bs.MLM_TARGETS)
        ce = F.cross_entropy(logits.float(), target, reduction="none")
        return {loss: weighted_mean(ce, valid), acc: accuracy(logits, target, valid)}
