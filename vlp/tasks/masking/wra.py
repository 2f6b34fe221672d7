"""WRA (UNITER's optional word-region alignment by optimal transport) trains on ITM batches:
no masking, swapped negatives, and regions to align words with."""

from vlp.tasks.masking.registry import MaskingPolicy, register_policy

WRA = register_policy(MaskingPolicy("wra", None, frozenset({"regions"}),
                                    lambda batch, rng, ctx: None, itm_negatives=True))
