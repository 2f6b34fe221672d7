"""vlp: single-stream vision-language pretraining experiments on Ray.

The rooms, lowest layer first (each imports only from the ones before it):

- ``vlp.contract``: batch keys, ``EncoderOutput``, batch checks, typed configs, atomic writes
- ``vlp.tasks``: the pretraining tasks (masking policy, head, loss), one file each
- ``vlp.models``: families, backbone, embeddings, downstream heads, checkpoint converters
- ``vlp.datasets``: storage, importers, synthetic world, audit, the stream and batching
- ``vlp.benchmarks``: the downstream benchmarks (options, head, metric) and Meta-Sum
- ``vlp.platform``: the Ray Train + DeepSpeed loop, pretraining, finetuning, sweeps, curation,
  MLflow tracking, the cluster
- ``vlp.testing`` (test doubles for tests and benchmarks) and ``vlp.commands`` (the CLI)

``vlp.contract``, ``vlp.tasks``, ``vlp.models`` and ``vlp.datasets`` never import Ray Train,
Ray Tune or MLflow (``tests/test_import_layers.py``).
"""

__version__ = "0.1.0"
