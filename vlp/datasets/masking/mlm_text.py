"""MLM on text-only batches from a text corpus (VL-BERT's BooksCorpus + Wikipedia batches):
BERT's masking; the batches come from ``vlp.datasets.text_corpus``, not from image shards."""

from vlp.datasets.masking.registry import MaskingPolicy, register_policy
from vlp.datasets.masking.text import mask_text

MLM_TEXT = register_policy(MaskingPolicy("mlm-text", "text", frozenset({"regions"}), mask_text,
                                         text_only=True))
