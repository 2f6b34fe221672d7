"""The data, in rooms: ``storage`` (the on-disk format: image shards, task tables, the world
manifest), ``importers`` (public formats → storage), ``synth`` (the synthetic world),
``audit`` (leakage between pretraining and evaluation data), ``stream`` (the driver side and
the Ray Data map), ``batching`` (the worker side: windows, budgets, collate, masking) and
``downstream`` (benchmark tables → batches). Only ``stream.pipeline`` imports Ray (Ray Data).
"""
