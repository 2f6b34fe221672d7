"""ITM: no masking; the batch draws swapped negatives (see ``vlp.datasets.batching.itm_negatives``)."""

from vlp.tasks.masking.registry import MaskingPolicy, register_policy

ITM = register_policy(MaskingPolicy("itm", None, frozenset({"regions", "pixels"}),
                                    lambda batch, rng, ctx: None, itm_negatives=True))
