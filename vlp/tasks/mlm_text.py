"""MLM-text: masked language modelling on text-only batches (VL-BERT mixes BooksCorpus +
Wikipedia batches into pretraining). The MLM head itself (shared, tied to the word
embeddings); the batch carries no regions, so the text sees no image."""

from __future__ import annotations

from vlp.tasks.base import register_task
from vlp.tasks.mlm import MaskedLanguageModeling


@register_task
class TextOnlyMaskedLanguageModeling(MaskedLanguageModeling):
    name = "mlm-text"
    head_name = "mlm"
