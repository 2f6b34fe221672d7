"""The architecture: families by name, the backbone, embeddings, downstream heads, initialisers
and converters. The pretraining tasks' heads and losses are in ``vlp.tasks``; a model builds the
heads of the tasks it is given (``TASKS`` and ``get_task`` are re-exported from there).

    from vlp.models import create_model
    model, preprocess, report = create_model("uniter-tiny", tasks=["mlm", "itm"])
    out = model(batch, task="mlm")          # {"loss", "mlm_loss", "mlm_acc"}
    enc = model.encode(batch)               # sequence / pooled / text & region positions

Never imports Ray, MLflow, ``vlp.datasets`` or ``vlp.platform``.
"""

from vlp.models.backbone import EncoderOutput, VLBackbone
from vlp.models.checkpoints import (CheckpointError, LoadReport, export_uniter, load_uniter,
                                    save_uniter)
from vlp.models.family_config import FamilyConfig, TransformerConfig
from vlp.models.factory import ModelBundle, PreprocessSpec, create_model, list_families
from vlp.models.families import FAMILIES, get_family
from vlp.models.model import VLPModel
from vlp.models.predict import predict
from vlp.tasks import TASKS, get_task

__all__ = ["create_model", "list_families", "ModelBundle", "PreprocessSpec", "VLPModel",
           "EncoderOutput", "VLBackbone", "FamilyConfig", "TransformerConfig", "FAMILIES",
           "get_family", "TASKS", "get_task", "predict", "CheckpointError", "LoadReport",
           "export_uniter", "load_uniter", "save_uniter"]
