"""The official UNITER checkpoint layout (``uniter-base.pt`` / ``uniter-large.pt``): in and out.

The release is a bare state_dict, possibly fp16, named ``uniter.embeddings.*``,
``uniter.img_embeddings.*``, ``uniter.encoder.layer.N.*``, ``uniter.pooler.*`` and heads
``cls.predictions.*`` (MLM), ``feat_regress.*`` (MRFR), ``region_classifier.*`` (MRC/MRC-kl),
``itm_output.*``; tied tensors (MLM decoder = word embeddings, MRFR weight = img_linear weight)
are stored twice; older files say gamma/beta for LayerNorm weight/bias; the vocabulary is
bert-base-cased (28996). Our module names mirror that layout, so the conversion is a prefix
rename checked by :func:`~.state_dict_io.assign_strict`: the whole backbone is required, a head
present in the checkpoint must be complete, a head the model lacks is dropped (and reported),
a head the checkpoint lacks stays random (and is reported).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping

import torch

from vlp.models.model import VLPModel
from vlp.models.checkpoints.state_dict_io import (CheckpointError, LoadReport, assign_strict,
                                                  read_state_dict, rename_layernorm)
from vlp.contract.atomic_write import atomic_path

UNITER_VOCAB_SIZE = 28996  # bert-base-cased

BACKBONE = (  # (theirs, ours)
    ("uniter.embeddings.", "backbone.text_embeddings."),
    ("uniter.img_embeddings.", "backbone.visual."),
    ("uniter.encoder.", "backbone.encoder."),
    ("uniter.pooler.", "backbone.pooler."),
)
HEADS = {  # their prefix → our head name
    "cls.predictions.": "mlm",
    "feat_regress.": "mrfr",
    "region_classifier.": "region_classifier",
    "itm_output.": "itm",
}
DROPPED = {"uniter.embeddings.position_ids": "a position-id buffer; positions are recomputed"}
LAYOUT = BACKBONE + tuple((theirs, f"heads.{head}.") for theirs, head in HEADS.items())


def _require_uniter(model: VLPModel) -> None:
    if model.family.visual.kind != "uniter":
        raise CheckpointError(f"the UNITER layout holds UNITER models; {model.family.name} "
                              f"has {model.family.visual.kind} embeddings")


def _rename(key: str, table: tuple[tuple[str, str], ...]) -> str | None:
    for src, dst in table:
        if key.startswith(src):
            return dst + key[len(src):]
    return None


def load_uniter(model: VLPModel, state_dict: Mapping[str, torch.Tensor],
                source: str = "uniter state_dict") -> LoadReport:
    _require_uniter(model)
    report = LoadReport(source=source)
    tensors, heads_present = [], set()
    for key, value in state_dict.items():
        name = rename_layernorm(key)
        if name in DROPPED:
            report.dropped[key] = DROPPED[name]
            continue
        ours = _rename(name, LAYOUT)
        if ours is None:
            raise CheckpointError(f"checkpoint key {key!r} is not part of the UNITER layout "
                                  f"(source {source})")
        head = next((h for prefix, h in HEADS.items() if name.startswith(prefix)), None)
        if head is not None:
            if head not in model.heads:
                report.dropped[key] = f"the model has no {head} head"
                continue
            heads_present.add(head)
        tensors.append((ours, key, value))  # fp16 releases are cast to our dtype on copy

    inverse = tuple((dst, src) for src, dst in LAYOUT)

    def required(ours: str) -> str | None:
        if ours.startswith("backbone.") or ours.split(".")[1] in heads_present:
            return _rename(ours, inverse) or ours
        return None

    assign_strict(model, tensors, required, report)
    with torch.no_grad():  # row 0 of the mask embedding is held at zero (the reference
        model.backbone.visual.mask_embedding.weight[0].zero_()  # zeroes it every forward)
    return report


def load_uniter_path(model: VLPModel, path: str | os.PathLike) -> LoadReport:
    return load_uniter(model, read_state_dict(path), source=f"uniter:{path}")


def export_uniter(model: VLPModel, dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """Our model as a UNITER-layout state_dict (tied tensors twice, as in the release)."""
    _require_uniter(model)
    inverse = tuple((dst, src) for src, dst in LAYOUT)
    out = {}
    for ours, tensor in model.state_dict().items():
        theirs = _rename(ours, inverse)
        if theirs is None:
            raise CheckpointError(f"our tensor {ours!r} has no place in the UNITER layout")
        out[theirs] = tensor.detach().to("cpu", dtype).clone()
    return out


def save_uniter(model: VLPModel, path: str | os.PathLike,
                dtype: torch.dtype = torch.float32) -> Path:
    """Write :func:`export_uniter` atomically (temporary name, then rename)."""
    path = Path(path)
    with atomic_path(path) as tmp:
        torch.save(export_uniter(model, dtype), tmp)
    return path
