"""MLM-text: masked language modelling on text-only batches (VL-BERT mixes BooksCorpus +
Wikipedia batches into pretraining). The MLM head itself (shared, tied to the word
embeddings); the batch carries no regions, so the text sees no image."""

from __future__ import annotations

import torch
from torch import nn

from ..backbone import EncoderOutput
from .base import Batch, register_task
from .mlm import MaskedLanguageModeling


@register_task
class TextOnlyMaskedLanguageModeling(MaskedLanguageModeling):
    name = "mlm-text"
    head_name = "mlm"

    def compute(self, head: nn.Module, enc: EncoderOutput, batch: Batch) -> dict[str, torch.Tensor]:
        out = super().compute(head, enc, batch)
        return {"mlm-text_loss": out["mlm_loss"], "mlm-text_acc": out["mlm_acc"]}
