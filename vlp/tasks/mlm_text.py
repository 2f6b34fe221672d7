"""MLM-text: masked language modelling on text-only batches (VL-BERT mixes BooksCorpus +
Wikipedia batches into pretraining). BERT's masking; the batches come from
``vlp.datasets.batching.text_corpus``, not from image shards. The MLM head itself (shared,
tied to the word embeddings); the batch carries no regions, so the text sees no image."""

from __future__ import annotations

from vlp.tasks.mlm import MaskedLanguageModeling
from vlp.tasks.registry import register


@register
class TextOnlyMaskedLanguageModeling(MaskedLanguageModeling):
    name, label, order = "mlm-text", "MLM-text", 11
    head_name = "mlm"
    visual = frozenset({"regions"})
    families = frozenset({"vlbert"})
    text_only = True
