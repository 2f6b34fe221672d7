"""Pretrained weights out of a checkpoint: find them, check they fit, load them. The one
reader of what the training loop writes (``checkpointing``), used by finetuning, zero-shot
evaluation, curation's ITM scorer and the probes.

A checkpoint path (``--checkpoint``) may name: a checkpoint folder written by the pretraining loop
(Ray Train checkpoint holding a DeepSpeed checkpoint: ``vlp_trainer.json`` +
``<tag>/mp_rank_00_model_states.pt``), a pretraining *run* folder (its latest ``checkpoint_*`` is
taken), or a plain state-dict file of a ``VLPModel`` (``.pt`` / ``.safetensors``). Everything loads
with ``weights_only=True``.

Before anything is trained the checkpoint is checked against the requested family: every
backbone tensor must be present with the right shape. A checkpoint of another family is
recognised (its tensors are compared with every registered family's, built on the meta
device) and named in the error; a vocabulary that differs from the tokenizer's is an error
too, because word ids would index the wrong rows.
"""

from __future__ import annotations

import json
from functools import lru_cache
from dataclasses import dataclass, field
from pathlib import Path

import torch

from vlp.models import FAMILIES, VLPModel, get_family
from vlp.models.checkpoints import CheckpointError, LoadReport, read_state_dict
from vlp.models.checkpoints.state_dict_io import assign_strict
from vlp.models.heads import extra_type_rows
# where the weights are, re-exported (weights_location.py: what needs only the file)
from vlp.platform.training.weights_location import (  # noqa: F401
    MODEL_FILES, MODEL_STATES, TRAINER_META, fetch, local_weights, resolve)

WORD_EMBEDDINGS = "backbone.text_embeddings.word_embeddings.weight"
TYPE_TABLE = "backbone.text_embeddings.token_type_embeddings.weight"


@dataclass
class PretrainedWeights:
    path: str                                  # the file the tensors came from
    state: dict[str, torch.Tensor]             # VLPModel keys (backbone.*, heads.*)
    step: int | None = None                    # pretraining step, when the loop wrote it
    meta: dict = field(default_factory=dict)

    @property
    def vocab_size(self) -> int | None:
        w = self.state.get(WORD_EMBEDDINGS)
        return None if w is None else int(w.shape[0])


def read(path: str | Path) -> PretrainedWeights:
    file = resolve(path)
    if file.name == MODEL_STATES:
        raw = torch.load(file, map_location="cpu", weights_only=True)
        state = raw.get("module") if isinstance(raw, dict) else None
        if not isinstance(state, dict):
            raise CheckpointError(f"{file}: no 'module' state dict in this DeepSpeed file")
        meta = json.loads((file.parent.parent / TRAINER_META).read_text())
        return PretrainedWeights(str(file), dict(state), meta.get("step"), meta)
    return PretrainedWeights(str(file), read_state_dict(file))


@lru_cache(maxsize=64)
def backbone_shapes(family: str, feat_dim: int, vocab_size: int | None = None
                    ) -> dict[str, tuple[int, ...]]:
    """Backbone tensor shapes of ``family`` (built on the meta device: no memory)."""
    cfg = get_family(family)
    if vocab_size:
        cfg = cfg.replace({"transformer.vocab_size": vocab_size})
    with torch.device("meta"):
        model = VLPModel(cfg, ("itm",), feat_dim=feat_dim, num_classes=2)
    return {k: tuple(v.shape) for k, v in model.state_dict().items() if k.startswith("backbone.")}


def matching_families(weights: PretrainedWeights, feat_dim: int) -> list[str]:
    have = {k: tuple(v.shape) for k, v in weights.state.items() if k.startswith("backbone.")}
    return [name for name in FAMILIES
            if backbone_shapes(name, feat_dim, weights.vocab_size) == have]


def check_fits(weights: PretrainedWeights, family: str, feat_dim: int,
               tokenizer_vocab: int) -> None:
    """Raise :class:`CheckpointError` naming the cause when ``weights`` cannot initialise
    ``family`` reading features of width ``feat_dim`` with a tokenizer of ``tokenizer_vocab``."""
    vocab = weights.vocab_size
    if vocab is None:
        raise CheckpointError(f"{weights.path}: no {WORD_EMBEDDINGS}: not a vlp model checkpoint")
    if vocab != tokenizer_vocab:
        raise CheckpointError(
            f"{weights.path}: the checkpoint's vocabulary has {vocab} tokens, the tokenizer "
            f"{tokenizer_vocab}: word ids would index the wrong embeddings; finetune with the "
            f"tokenizer the checkpoint was pretrained with (model.tokenizer)")
    want = dict(backbone_shapes(family, feat_dim, vocab))
    have = {k: tuple(v.shape) for k, v in weights.state.items() if k.startswith("backbone.")}
    if TYPE_TABLE in have and TYPE_TABLE in want and have[TYPE_TABLE][0] > want[TYPE_TABLE][0]:
        want[TYPE_TABLE] = (have[TYPE_TABLE][0], want[TYPE_TABLE][1])   # see check_type_rows
    if want == have:
        return
    others = [f for f in matching_families(weights, feat_dim) if f != family]
    if others:
        raise CheckpointError(f"{weights.path} is a checkpoint of family {others[0]!r}, not "
                              f"{family!r}: finetune it with model.family={others[0]}")
    missing = sorted(set(want) - set(have))
    extra = sorted(set(have) - set(want))
    wrong = sorted(k for k in set(want) & set(have) if want[k] != have[k])
    if wrong:
        k = wrong[0]
        hint = (" (region feature width: the world's features do not match the checkpoint's)"
                if "img_linear" in k or "visual_linear" in k else "")
        raise CheckpointError(f"{weights.path}: tensor {k!r} has shape {list(have[k])}, family "
                              f"{family!r} expects {list(want[k])}{hint}")
    raise CheckpointError(f"{weights.path} does not fit family {family!r}: "
                          + (f"missing {missing[:3]}" if missing else f"unexpected {extra[:3]}"))


def type_rows_beyond(weights: PretrainedWeights, family: str) -> int:
    """Token-type rows the checkpoint has beyond ``family``'s (a downstream layout pretrained
    in: UNITER's VCR second stage adds answer and rationale rows)."""
    table = weights.state.get(TYPE_TABLE)
    base = get_family(family).transformer.type_vocab_size
    return 0 if table is None else max(0, int(table.shape[0]) - base)


def check_type_rows(weights: PretrainedWeights, family: str, benchmark: str,
                    layout: str | None) -> int:
    """The rows beyond the family's, when the benchmark's token-type ``layout`` adds exactly
    those (the finetune extends the model for it before loading); otherwise an error naming
    the mismatch."""
    extra = type_rows_beyond(weights, family)
    if extra and extra != extra_type_rows(get_family(family), layout):
        have = extra + get_family(family).transformer.type_vocab_size
        raise CheckpointError(
            f"{weights.path}: its token-type table has {have} rows, {extra} beyond {family}'s "
            f"(pretrained for a downstream layout such as VCR's second stage); benchmark "
            f"{benchmark!r} uses " + (f"layout {layout!r}, which adds "
                                       f"{extra_type_rows(get_family(family), layout)}"
                                       if layout else "none"))
    return extra


def load_into(model: VLPModel, weights: PretrainedWeights) -> LoadReport:
    """Backbone (all of it, required) and the ITM head when both have one; pretraining heads
    the downstream model does not use are reported as dropped."""
    report = LoadReport(source=f"checkpoint:{weights.path}")
    ours = model.state_dict()
    tensors = []
    for key, value in weights.state.items():
        if key in ours:
            tensors.append((key, key, value.float()))
        else:
            report.dropped[key] = "pretraining head not used downstream"
    return assign_strict(model, tensors, lambda k: k if k.startswith("backbone.") else None,
                         report)
