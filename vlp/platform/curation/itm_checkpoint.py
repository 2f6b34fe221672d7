"""The model whose ITM head scores pairs for the semantic filter, from a checkpoint on disk.

Accepted (``--checkpoint PATH``):
- a weights file ``vlp.models`` reads (``read_state_dict``: ``.pt`` / ``.bin`` loaded with
  ``weights_only=True``, or ``.safetensors``), in our layout (``backbone.*``, ``heads.*``:
  ``torch.save(model.state_dict())``) or the UNITER release layout (``uniter.*``,
  ``itm_output.*``: ``save_uniter``);
- a Ray Train checkpoint folder written by ``vlp.platform`` pretraining (``vlp_trainer.json``
  + the DeepSpeed checkpoint): the module weights of its tag's ``mp_rank_00_model_states.pt``.

- a pretraining run folder (its latest ``checkpoint_*``).

Only the backbone and the ITM head are loaded; every backbone tensor must be there with its
shape (``assign_strict``), other heads are dropped and reported. A checkpoint does not say
which family built it: the family comes from ``--family``, from a *model card*
``vlp_model.json`` beside the weights (or in the checkpoint folder or its parent run folder:
``{"family": "uniter-tiny", "overrides": {...}}``), or else from the tensors themselves: the
one registered family whose backbone has exactly these names and shapes (built on the meta
device, no memory). The vocabulary size is read off the word-embedding matrix, D and C come
from the data being curated.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import torch

from vlp.platform.training.pretrained_weights import WORD_EMBEDDINGS

MODEL_CARD = "vlp_model.json"
UNITER_WORD_EMBEDDINGS = "uniter.embeddings.word_embeddings.weight"


class ItmCheckpointError(ValueError):
    """The checkpoint cannot give an ITM scorer; the message says why and what to pass."""


@dataclass
class ScoringModel:
    model: Any               # vlp.models.VLPModel with the itm head
    preprocess: Any          # vlp.models.PreprocessSpec
    source: str
    summary: str             # what loaded, what was dropped


def save_model_card(folder: str | os.PathLike, family: str, **extra) -> Path:
    """Write ``vlp_model.json`` so that a weights file in ``folder`` names its family."""
    from vlp.contract.atomic_write import write_json_atomic
    path = Path(folder) / MODEL_CARD
    write_json_atomic(path, {"family": family, **extra})
    return path


def _card(path: Path) -> dict:
    folder = path if path.is_dir() else path.parent
    for candidate in (folder / MODEL_CARD, folder.parent / MODEL_CARD):
        if candidate.is_file():
            return json.loads(candidate.read_text())
    return {}


def read_weights(path: str | os.PathLike) -> tuple[dict[str, torch.Tensor], str]:
    """(state_dict, layout) from a weights file or a vlp pretraining checkpoint folder."""
    from vlp.models.checkpoints import CheckpointError
    from vlp.platform.training import pretrained_weights
    try:
        state = pretrained_weights.read(path).state
    except CheckpointError as e:
        raise ItmCheckpointError(str(e)) from None
    if any(k.startswith("uniter.") for k in state):
        return state, "uniter"
    if any(k.startswith("backbone.") for k in state):
        return state, "vlp"
    raise ItmCheckpointError(f"{path}: neither our layout (backbone.*, heads.*) nor the "
                             f"UNITER layout (uniter.*); first keys: {list(state)[:3]}")


def load_scoring_model(path: str | os.PathLike, *, region_feat_dim: int, num_classes: int,
                       family: str | None = None, device: str = "cpu") -> ScoringModel:
    from vlp.models import create_model
    from vlp.models.checkpoints import CheckpointError, LoadReport, load_uniter
    from vlp.models.checkpoints.state_dict_io import assign_strict

    path = Path(path)
    state, layout = read_weights(path)
    card = _card(path)
    vocab = state.get(WORD_EMBEDDINGS, state.get(UNITER_WORD_EMBEDDINGS))
    vocab_size = None if vocab is None else int(vocab.shape[0])
    family = family or card.get("family") or (
        _family_of(state, region_feat_dim) if layout == "vlp" else None)
    if not family:
        raise ItmCheckpointError(f"{path}: the checkpoint does not say which model family "
                                 f"built it: pass --family (e.g. uniter-base) or put a "
                                 f"{MODEL_CARD} with {{\"family\": ...}} beside it")
    try:
        bundle = create_model(family, tasks=["itm"], init="random",
                              region_feat_dim=region_feat_dim, num_classes=num_classes,
                              vocab_size=vocab_size,
                              overrides=card.get("overrides"))
    except (KeyError, ValueError) as e:
        raise ItmCheckpointError(f"{path}: cannot build {family!r} with an ITM head: {e}"
                                 ) from None
    model = bundle.model
    report = LoadReport(source=f"{layout}:{path}")
    try:
        if layout == "uniter":
            report = load_uniter(model, state, source=f"uniter:{path}")
            if "itm" in (k.split(".")[1] for k in report.random_init if k.startswith("heads.")):
                raise ItmCheckpointError(f"{path}: the checkpoint has no ITM head "
                                         f"(itm_output.*): it cannot score pairs")
        else:
            if not any(k.startswith("heads.itm.") for k in state):
                raise ItmCheckpointError(f"{path}: the checkpoint has no ITM head "
                                         f"(heads.itm.*): pretrain with the itm task")
            keep = [(k, k, v) for k, v in state.items()
                    if k.startswith(("backbone.", "heads.itm."))]
            report.dropped = {k: "not the backbone or the ITM head" for k in state
                              if not k.startswith(("backbone.", "heads.itm."))}
            assign_strict(model, keep, required=lambda ours: ours, report=report)
    except CheckpointError as e:
        raise ItmCheckpointError(f"{path}: {e}") from None
    model.to(device).eval()
    return ScoringModel(model, bundle.preprocess, str(path), report.summary())


def _family_of(state: Mapping[str, torch.Tensor], feat_dim: int) -> str | None:
    """The one registered family whose backbone has exactly the checkpoint's tensors."""
    from vlp.platform.training.pretrained_weights import PretrainedWeights, matching_families
    found = matching_families(PretrainedWeights("", dict(state)), feat_dim)
    return found[0] if len(found) == 1 else None
