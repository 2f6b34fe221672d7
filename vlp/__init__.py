"""vlp: single-stream vision-language pretraining experiments on Ray.

Subpackages: ``vlp.datasets`` (shards, synthetic world, pipeline, masking),
``vlp.models`` (backbones, heads, registry, converters), ``vlp.platform`` (Ray Train +
DeepSpeed loop, evaluation, sweeps, MLflow). ``vlp.models`` and ``vlp.datasets`` never import
Ray Train/Tune or MLflow.
"""

__version__ = "0.1.0"
