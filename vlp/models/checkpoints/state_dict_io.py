"""Reading checkpoints safely, and the strict assignment every converter goes through.

Every converter renames checkpoint keys to ours and hands them to :func:`assign_strict`,
which refuses (naming the checkpoint key) any key it cannot place, any shape that does not
match, and any missing key the converter marked as required; tied tensors stored twice must
agree. What it did is returned as a :class:`LoadReport`, never only logged.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Mapping

import torch
from safetensors.torch import load_file
from torch import nn


class CheckpointError(ValueError):
    """A checkpoint does not fit the model; the message names the offending key."""


@dataclass
class LoadReport:
    source: str
    loaded: list[str] = field(default_factory=list)         # checkpoint keys placed
    dropped: dict[str, str] = field(default_factory=dict)   # checkpoint key → why it is unused
    random_init: list[str] = field(default_factory=list)    # our parameters left as initialised
    partial: dict[str, str] = field(default_factory=dict)   # our key → what was copied

    def summary(self) -> str:
        return (f"{self.source}: loaded {len(self.loaded)} tensors, "
                f"{len(self.random_init)} of ours initialised randomly, "
                f"{len(self.dropped)} checkpoint tensors deliberately unused"
                + (f", partially loaded: {sorted(self.partial)}" if self.partial else ""))


def read_state_dict(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """A state_dict from a safetensors / torch file, or from a Hugging Face model folder.
    torch files load with ``weights_only=True`` (no pickled code runs)."""
    path = Path(path)
    if path.is_dir():
        for name in ("model.safetensors", "pytorch_model.bin"):
            if (path / name).is_file():
                return read_state_dict(path / name)
        raise CheckpointError(f"{path}: a model folder needs model.safetensors or "
                              "pytorch_model.bin")
    if not path.is_file():
        raise CheckpointError(f"{path}: no such checkpoint file")
    if path.suffix == ".safetensors":
        return load_file(str(path))
    state = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(state, Mapping):
        raise CheckpointError(f"{path}: expected a state_dict (a mapping of name → tensor), "
                              f"got {type(state).__name__}")
    for key, value in state.items():
        if not isinstance(value, torch.Tensor):
            raise CheckpointError(f"{path}: key {key!r} holds a {type(value).__name__}, not a "
                                  "tensor (pass the bare state_dict)")
    return dict(state)


def rename_layernorm(key: str) -> str:
    """Old BERT/UNITER checkpoints name LayerNorm parameters gamma/beta."""
    if key.endswith(".gamma"):
        return key[: -len("gamma")] + "weight"
    if key.endswith(".beta"):
        return key[: -len("beta")] + "bias"
    return key


VOCAB_KEYS = ("word_embeddings.weight", "decoder.weight", "predictions.bias", "mlm.bias")


def _shape_error(ckpt_key: str, got: torch.Size, want: torch.Size) -> CheckpointError:
    message = (f"checkpoint key {ckpt_key!r} has shape {list(got)} but the model expects "
               f"{list(want)}")
    if ckpt_key.endswith(VOCAB_KEYS) and got[0] != want[0]:
        message += (f": vocabulary size {got[0]} vs the model's {want[0]} — build the model "
                    f"with vocab_size={got[0]} and the tokenizer that matches the checkpoint")
    return CheckpointError(message)


def assign_strict(model: nn.Module, tensors: Iterable[tuple[str, str, torch.Tensor]],
                  required: Callable[[str], str | None], report: LoadReport,
                  grow_rows: frozenset[str] = frozenset()) -> LoadReport:
    """Copy ``tensors`` (our key, checkpoint key, tensor) into ``model``.

    For each of our tensors that nothing reached (through any alias of a tied parameter),
    ``required(our_key)`` gives the checkpoint key it needed, or None if it may stay as
    initialised; ``grow_rows`` names our keys whose checkpoint tensor may have fewer rows
    (the first rows are copied: BERT's 2 token types into VL-BERT's 3)."""
    ours = model.state_dict(keep_vars=True)
    written: dict[int, tuple[str, torch.Tensor]] = {}
    for our_key, ckpt_key, value in tensors:
        target = ours.get(our_key)
        if target is None:
            raise CheckpointError(f"checkpoint key {ckpt_key!r} has no place in this model "
                                  f"(would be {our_key!r})")
        # cast here, move in copy_: the tied-value check below then compares the checkpoint's
        # own tensors, also when the model is built on the meta device (preflight)
        value = value.to(dtype=target.dtype)
        if value.shape != target.shape:
            fits_rows = (our_key in grow_rows and value.dim() == target.dim()
                         and value.shape[1:] == target.shape[1:]
                         and value.shape[0] <= target.shape[0])
            if not fits_rows:
                raise _shape_error(ckpt_key, value.shape, target.shape)
            report.partial[our_key] = f"rows 0..{value.shape[0] - 1} from {ckpt_key}"
        earlier = written.get(id(target))
        if earlier is not None and not torch.equal(earlier[1], value):
            raise CheckpointError(f"checkpoint key {ckpt_key!r} should be tied to "
                                  f"{earlier[0]!r} but holds different values")
        with torch.no_grad():   # a 0-d buffer (BatchNorm's num_batches_tracked) has no rows
            (target[: value.shape[0]] if value.dim() else target).copy_(value)
        written[id(target)] = (ckpt_key, value)
        report.loaded.append(ckpt_key)
    for our_key, target in ours.items():
        if id(target) in written:
            continue
        needed = required(our_key)
        if needed is not None:
            raise CheckpointError(f"checkpoint lacks key {needed!r} (for our {our_key!r}; "
                                  f"source {report.source})")
        report.random_init.append(our_key)
    return report
