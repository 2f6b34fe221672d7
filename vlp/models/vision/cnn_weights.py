"""SOHO's CNN from a torchvision-format checkpoint file (the paper starts from ImageNet).

The file is a state dict in torchvision's ResNet layout (``conv1.weight``, ``bn1.*``,
``layer1.0.conv1.weight`` …), as ``torchvision.models.resnet18(weights=...).state_dict()``
saves it. Every trunk key must be there with the trunk's shape; the classifier (``fc.*``)
and BatchNorm's ``num_batches_tracked`` counters may be there or not; anything else is an
error, so a checkpoint of another depth or width never half-loads. Nothing is downloaded
here: a checkpoint in shared storage is copied to a local file by the platform first
(``vlp.platform.pretrain.init_weights_check.cnn_init_file``), and ``shown`` then names it.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

OPTIONAL_SUFFIXES = ("num_batches_tracked",)
CLASSIFIER_PREFIX = "fc."


def _read(path: str, shown: str | None = None) -> dict[str, torch.Tensor]:
    file, path = Path(path).expanduser(), shown or path
    if not file.is_file():
        raise ValueError(f"model.cnn_init: {path}: no such file (a torchvision ResNet "
                         "state dict)")
    state = torch.load(file, map_location="cpu", weights_only=True)
    if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
        state = state["state_dict"]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor)
                                              for v in state.values()):
        raise ValueError(f"model.cnn_init: {path}: expected a state dict of tensors "
                         "(torchvision's ResNet layout)")
    return state


def cnn_weights_problem(trunk: nn.Module, path: str, shown: str | None = None) -> str | None:
    """One line saying why ``path`` does not fit ``trunk`` (None when it does); the line names
    ``shown`` (where the file came from) when given."""
    try:
        state = _read(path, shown)
    except ValueError as e:
        return str(e)
    own = trunk.state_dict()
    required = [k for k in own if not k.endswith(OPTIONAL_SUFFIXES)]
    missing = [k for k in required if k not in state]
    extra = [k for k in state if k not in own and not k.startswith(CLASSIFIER_PREFIX)]
    wrong = [f"{k} {tuple(state[k].shape)} (expected {tuple(own[k].shape)})"
             for k in required if k in state and state[k].shape != own[k].shape]
    for what, keys in (("missing", missing), ("unexpected", extra), ("wrong shape", wrong)):
        if keys:
            more = f" and {len(keys) - 3} more" if len(keys) > 3 else ""
            return (f"model.cnn_init: {shown or path}: {len(keys)} {what} key(s) for this "
                    f"{type(trunk).__name__}: {', '.join(keys[:3])}{more}")
    return None


def load_cnn_weights(trunk: nn.Module, path: str) -> int:
    """Copy the checkpoint into ``trunk``; returns the number of tensors loaded. Raises
    ``ValueError`` with :func:`cnn_weights_problem`'s line when it does not fit."""
    problem = cnn_weights_problem(trunk, path)
    if problem:
        raise ValueError(problem)
    state = _read(path)
    own = trunk.state_dict()
    keep = {k: v for k, v in state.items() if k in own}
    trunk.load_state_dict(keep, strict=False)   # only optional counters can be absent
    return len(keep)
