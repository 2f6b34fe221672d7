"""The initial weights (``model.init`` minilm / bert / uniter) checked on the driver.

A checkpoint that does not fit the model (a key it cannot place, a wrong shape, another
vocabulary, a truncated file) is a property of the file, not a fault: found inside a Ray Train
worker it would fail every retry the same way. So the driver builds the model exactly as the
workers will — on the meta device, so no memory is spent on weights — and runs the same
strict loader over the file, raising one ``ConfigError`` on ``model.init_path`` that names the
file and the mismatch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vlp.contract.config_loader import ConfigError
from vlp.platform.cluster.run_storage import is_uri
from vlp.platform.pretrain.experiment_config import ExperimentConfig, ModelSection
from vlp.platform.training.weights_location import local_weights

NEEDS_A_FILE = ("minilm", "bert", "uniter")     # inits that read weights


def model_kwargs(model: ModelSection, setup: Any) -> dict[str, Any]:
    """``create_model``'s arguments for this run: what the workers build
    (``PretrainComponents.build_model``) and what the driver checks here."""
    p = model.dropout
    vocab = setup.vocab_size if setup.vocab_size != setup.preprocess.vocab_size else None
    init = model.init_spec()
    if model.init_path and is_uri(model.init_path):
        # each node reads the weights from the storage into its own cache (pretrained_weights'
        # reader: the endpoint and keys from the standard AWS environment)
        init = f"{model.init}:{local_weights(model.init_path)}"
    overrides: dict[str, Any] = {"transformer.hidden_dropout": p,
                                 "transformer.attention_dropout": p,
                                 "transformer.fused_qkv": model.fused_qkv,
                                 "transformer.attention": model.attention}
    if model.dictionary_init:
        overrides["visual.dictionary_init"] = model.dictionary_init
    if model.mrfr_reduction:
        overrides["mrfr_reduction"] = model.mrfr_reduction
    return dict(family=setup.family, tasks=list(setup.tasks), init=init,
                region_feat_dim=setup.feature_dim or 2048,
                num_classes=setup.num_classes or 1601, vocab_size=vocab, overrides=overrides)


def cnn_init_file(model: ModelSection) -> str:
    """``model.cnn_init`` (SOHO's torchvision ResNet) as a local file: a URI is read into this
    node's cache by the reader of ``model.init_path`` (``weights_location.fetch``), on the
    driver for the check and on each worker's node for the load."""
    if is_uri(model.cnn_init):
        return local_weights(model.cnn_init)
    return str(Path(model.cnn_init).expanduser())


def check_init_weights(cfg: ExperimentConfig, setup: Any) -> None:
    """Raise ``ConfigError`` (key ``model.init_path``, or ``model.init`` for the packaged
    weights) when the run's initial weights cannot initialise its model."""
    if cfg.model.init not in NEEDS_A_FILE:
        return
    import torch

    from vlp.models import create_model

    key = "model.init_path" if cfg.model.init_path else "model.init"
    where = cfg.model.init_path or f"the packaged {cfg.model.init} weights"
    try:
        with torch.device("meta"):
            create_model(**model_kwargs(cfg.model, setup))
    except Exception as e:      # any failure to read or place the file is the file's problem
        cause = " ".join(str(e).split()) or type(e).__name__
        kind = "" if type(e).__name__ == "CheckpointError" else f"{type(e).__name__}: "
        raise ConfigError([(key, f"{where} does not fit {setup.family} (tasks "
                                 f"{', '.join(setup.tasks)}, vocabulary {setup.vocab_size:,}): "
                                 f"{kind}{cause}")]) from None
