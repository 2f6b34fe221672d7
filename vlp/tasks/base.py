"""A pretraining task = its head + its loss; the registry maps task names to tasks.

A task builds its head (tasks that share a head — MRC and MRC-kl share UNITER's
``region_classifier``, WRA adds to ITM's — name the same ``head_name``) and turns the backbone's
:class:`~vlp.contract.encoder_output.EncoderOutput` and the batch into ``{"{task}_loss": …}`` plus
detached metrics. The masking policy lives in the data pipeline (``vlp.datasets``), which
serves each batch to one task; only SOHO's MVM masks inside the model, because its mask depends
on the visual dictionary (``masks_visual_tokens``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Mapping

import torch
from torch import nn

from vlp.contract import batch_spec as bs

from vlp.contract.encoder_output import EncoderOutput
from vlp.contract.batch_access import positive_pairs, require

Batch = Mapping[str, torch.Tensor]


@dataclass(frozen=True)
class HeadContext:
    """What a head's constructor may need: sizes, and the backbone for weight tying."""

    hidden_size: int
    vocab_size: int
    feat_dim: int
    num_classes: int
    layer_norm_eps: float
    backbone: nn.Module               # the VLBackbone, for weight tying


class Task:
    name: ClassVar[str]
    head_name: ClassVar[str]
    needs_pooled: ClassVar[bool] = False         # the backbone runs its pooler
    masks_visual_tokens: ClassVar[bool] = False  # the embedder masks visual tokens (MVM)

    def build_head(self, ctx: HeadContext) -> nn.Module:
        raise NotImplementedError

    def compute(self, head: nn.Module, enc: EncoderOutput, batch: Batch) -> dict[str, torch.Tensor]:
        raise NotImplementedError


TASKS: dict[str, Task] = {}


def register_task(cls: type[Task]) -> type[Task]:
    if cls.name in TASKS:
        raise ValueError(f"task {cls.name!r} registered twice")
    TASKS[cls.name] = cls()
    return cls


def get_task(name: str) -> Task:
    try:
        return TASKS[name]
    except KeyError:
        raise KeyError(f"unknown pretraining task {name!r}; known: {', '.join(TASKS)}") from None


def zero_loss(enc: EncoderOutput) -> torch.Tensor:
    """A zero that stays on the graph: a batch with nothing to predict (e.g. only negative
    pairs) must still give every rank a finite loss and a backward pass."""
    return enc.sequence_output.sum() * 0.0


def accuracy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    if labels.numel() == 0:
        return logits.new_zeros(())
    return (logits.detach().argmax(-1) == labels).float().mean()


def masked_regions(enc: EncoderOutput, batch: Batch, who: str) -> torch.Tensor:
    """bool [B, N]: regions whose loss counts — masked, real, and in a true pair."""
    masked = require(batch, bs.REGION_MASKED, who).bool()
    positive = positive_pairs(batch, masked.shape[0], masked.device)
    return masked & enc.region_mask & positive[:, None]
