"""A downstream head = its layers + its loss + its prediction, on top of the shared backbone.

Heads receive the backbone itself (not its output) because some need to run it their own way:
retrieval's hard-negative mining scores candidates without gradients before the training
pass. ``losses`` returns ``{"{name}_loss": …}`` plus detached metrics (the training loop sums
the ``*_loss`` entries); ``predict`` returns the evaluation scores.
"""

from __future__ import annotations

from typing import Mapping

import torch
from torch import nn

from vlp.models.backbone import EncoderOutput, VLBackbone

Batch = Mapping[str, torch.Tensor]


class DownstreamHead(nn.Module):
    name: str = ""

    def losses(self, backbone: VLBackbone, batch: Batch) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def predict(self, backbone: VLBackbone, batch: Batch) -> torch.Tensor:
        raise NotImplementedError


def encode(backbone: VLBackbone, batch: Batch) -> EncoderOutput:
    return backbone(batch, pool=True)


def mlp(hidden: int, width: int, out: int, eps: float = 1e-12) -> nn.Sequential:
    """UNITER's downstream MLP: Linear(hidden, width) → GELU → LayerNorm →
    Linear(width, out)."""
    return nn.Sequential(nn.Linear(hidden, width), nn.GELU(), nn.LayerNorm(width, eps=eps),
                         nn.Linear(width, out))


def group_view(x: torch.Tensor, batch: Batch, key: str = "group_size") -> torch.Tensor:
    """[rows] → [examples, group] for batches whose examples span several rows."""
    return x.view(-1, int(batch[key]))


def accuracy(scores: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return (scores.detach().argmax(-1) == labels).float().mean()
