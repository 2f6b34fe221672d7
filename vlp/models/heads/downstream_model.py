"""``DownstreamModel``: a (pretrained) backbone plus one benchmark head.

Called like a pretraining model — ``model(batch, task=name)`` → ``{"loss", "{name}_loss", …}``
— so the platform's training loop finetunes it unchanged; ``predict(batch)`` gives the
evaluation scores.
"""

from __future__ import annotations

from typing import Mapping

import torch
from torch import nn

from vlp.models.backbone import VLBackbone
from vlp.models.heads.head import DownstreamHead


class DownstreamModel(nn.Module):
    def __init__(self, backbone: VLBackbone, head: DownstreamHead):
        super().__init__()
        self.backbone = backbone
        self.head = head

    @property
    def task_name(self) -> str:
        return self.head.name

    def forward(self, batch: Mapping[str, torch.Tensor], task: str) -> dict[str, torch.Tensor]:
        if task != self.head.name:
            raise KeyError(f"this model finetunes {self.head.name!r}, not {task!r}")
        out = self.head.losses(self.backbone, batch)
        out["loss"] = sum(v for k, v in out.items() if k.endswith("_loss"))
        return out

    def predict(self, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        return self.head.predict(self.backbone, batch)
