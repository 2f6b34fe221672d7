"""The architecture: families by name, the backbone, embeddings, downstream heads, initialisers
and converters. The pretraining tasks' heads and losses are in ``vlp.tasks``; a model builds the
heads of the tasks it is given (``TASKS`` and ``get_task`` are re-exported from there).

    from vlp.models import create_model
    model, preprocess, report = create_model("uniter-tiny", tasks=["mlm", "itm"])
    out = model(batch, task="mlm")          # {"loss", "mlm_loss", "mlm_acc"}
    enc = model.encode(batch)               # sequence / pooled / text & region positions

Never imports Ray, MLflow, ``vlp.datasets`` or ``vlp.platform``.

The names below are loaded on first use (PEP 562), not when the package is: importing a light
submodule such as the extractor registry (``vlp data extract --help``, the CLI's parser) then
does not import the backbone and transformers' BERT with it (~3 CPU s a process).
"""

from __future__ import annotations

from vlp.models.lazy_names import lazy_names

_FROM = {
    "EncoderOutput": "vlp.models.backbone", "VLBackbone": "vlp.models.backbone",
    "CheckpointError": "vlp.models.checkpoints.state_dict_io",
    "LoadReport": "vlp.models.checkpoints.state_dict_io",
    "export_uniter": "vlp.models.checkpoints.uniter_release",
    "load_uniter": "vlp.models.checkpoints.uniter_release",
    "save_uniter": "vlp.models.checkpoints.uniter_release",
    "FamilyConfig": "vlp.models.family_config", "TransformerConfig": "vlp.models.family_config",
    "ModelBundle": "vlp.models.factory", "PreprocessSpec": "vlp.models.factory",
    "create_model": "vlp.models.factory", "list_families": "vlp.models.factory",
    "FAMILIES": "vlp.models.families", "get_family": "vlp.models.families",
    "VLPModel": "vlp.models.model",
    "predict": "vlp.models.predict",
    "TASKS": "vlp.tasks", "get_task": "vlp.tasks",
}


__getattr__, __dir__ = lazy_names(__name__, _FROM, globals())

__all__ = ["create_model", "list_families", "ModelBundle", "PreprocessSpec", "VLPModel",
           "EncoderOutput", "VLBackbone", "FamilyConfig", "TransformerConfig", "FAMILIES",
           "get_family", "TASKS", "get_task", "predict", "CheckpointError", "LoadReport",
           "export_uniter", "load_uniter", "save_uniter"]
