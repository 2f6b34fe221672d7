"""VL-BERT's sentence-image relationship prediction: no masking; half of the pairs get a
caption "randomly chosen from the whole dataset" (VL-BERT §3.3): negatives swap the *text*
only, never the image (UNITER's ITM swaps either)."""

from vlp.tasks.masking.registry import MaskingPolicy, register_policy

SIRP = register_policy(MaskingPolicy("sirp", None, frozenset({"regions"}),
                                     lambda batch, rng, ctx: None, itm_negatives=True,
                                     negatives_swap="text", image_feat=True))
