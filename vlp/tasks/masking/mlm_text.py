"""MLM on text-only batches from a text corpus (VL-BERT's BooksCorpus + Wikipedia batches):
BERT's masking; the batches come from ``vlp.datasets.batching.text_corpus``, not from image shards."""

from vlp.tasks.masking.registry import MaskingPolicy, register_policy
from vlp.tasks.masking.text import mask_text

MLM_TEXT = register_policy(MaskingPolicy("mlm-text", "text", frozenset({"regions"}), mask_text,
                                         text_only=True))
