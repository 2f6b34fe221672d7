"""Initialisers by name: ``random``, ``minilm``, ``bert:<path>``, ``uniter:<path>``.

Every initialiser starts from the random BERT init, then loads what its source provides; it
returns a :class:`~.state_dict_io.LoadReport` saying what came from where.
"""

from __future__ import annotations

from typing import Callable

from vlp.models.model import VLPModel
from vlp.models.checkpoints.random_init import init_bert_weights
from vlp.models.checkpoints.state_dict_io import LoadReport
from vlp.models.checkpoints.text_bert import load_bert_path, load_minilm
from vlp.models.checkpoints.uniter_release import load_uniter_path


def _random(model: VLPModel, arg: str | None) -> LoadReport:
    return LoadReport(source="random", random_init=list(model.state_dict()))


def _minilm(model: VLPModel, arg: str | None) -> LoadReport:
    return load_minilm(model)


def _with_path(load: Callable[[VLPModel, str], LoadReport], name: str):
    def run(model: VLPModel, arg: str | None) -> LoadReport:
        if not arg:
            raise ValueError(f"init {name!r} needs a path: '{name}:/path/to/checkpoint'")
        return load(model, arg)
    return run


INITIALIZERS: dict[str, Callable[[VLPModel, str | None], LoadReport]] = {
    "random": _random,
    "minilm": _minilm,
    "bert": _with_path(load_bert_path, "bert"),
    "uniter": _with_path(load_uniter_path, "uniter"),
}


def initialize(model: VLPModel, spec: str) -> LoadReport:
    name, _, arg = spec.partition(":")
    if name not in INITIALIZERS:
        raise KeyError(f"unknown init {spec!r}; known: "
                       "random, minilm, bert:<path>, uniter:<path>")
    init_bert_weights(model, model.family.transformer.initializer_range)
    return INITIALIZERS[name](model, arg or None)
