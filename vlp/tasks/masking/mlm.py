"""MLM: masked language modeling conditioned on the image (all four families)."""

from vlp.tasks.masking.registry import MaskingPolicy, register_policy
from vlp.tasks.masking.text import mask_text

MLM = register_policy(MaskingPolicy("mlm", "text", frozenset({"regions", "pixels"}),
                                    mask_text))
