"""VLPModel: the backbone plus the heads of the tasks it was built for.

``model(batch, task="mlm")`` runs one pretraining task on a batch of the contract in
``vlp.contract.batch_spec`` and returns ``{"loss", "{task}_loss", …metrics}``; ``loss`` is the
sum of the ``*_loss`` entries. ``model.encode(batch)`` is what downstream heads build on:
packed sequence output, pooled [CLS], and where the text and regions sit in the packed row.
"""

from __future__ import annotations

from typing import Iterable, Mapping

import torch
from torch import nn

from vlp.contract import batch_spec as bs

from vlp.models.backbone import EncoderOutput, VLBackbone
from vlp.models.family_config import FamilyConfig
from vlp.models.embeddings.embedded_inputs import METRIC_PREFIX
from vlp.tasks import HeadContext, Task, get_task


class VLPModel(nn.Module):
    def __init__(self, family: FamilyConfig, tasks: Iterable[str], feat_dim: int,
                 num_classes: int):
        super().__init__()
        tasks = tuple(dict.fromkeys(tasks))  # ordered, without repeats
        for name in tasks:
            get_task(name)  # unknown names fail here, naming the task
            if name not in family.tasks:
                raise ValueError(f"task {name!r} does not apply to family {family.name!r} "
                                 f"(its tasks: {', '.join(family.tasks)})")
        self.family = family
        self.feat_dim, self.num_classes = feat_dim, num_classes
        self.task_names = tasks
        self.backbone = VLBackbone(family, feat_dim)
        ctx = HeadContext(hidden_size=family.transformer.hidden_size,
                          vocab_size=family.transformer.vocab_size, feat_dim=feat_dim,
                          num_classes=num_classes,
                          layer_norm_eps=family.transformer.layer_norm_eps,
                          backbone=self.backbone)
        self.heads = nn.ModuleDict()
        for name in tasks:
            task = get_task(name)
            if task.head_name not in self.heads:  # tasks naming one head share it
                self.heads[task.head_name] = task.build_head(ctx)

    def task(self, name: str) -> Task:
        if name not in self.task_names:
            raise KeyError(f"this {self.family.name} model was built for tasks "
                           f"{list(self.task_names)}, not {name!r}")
        return get_task(name)

    def forward(self, batch: Mapping[str, torch.Tensor], task: str | tuple[str, ...],
                weights: Mapping[str, float] | None = None) -> dict[str, torch.Tensor]:
        """One task's outputs; for a tuple of tasks (a forward group: one batch masked for all
        of them) one backbone pass and every task's head on it, ``loss`` = Σ weight · loss."""
        names = (task,) if isinstance(task, str) else tuple(task)
        specs = [self.task(t) for t in names]
        # joint masking flags images on the other tasks' batches too (tasks/masking_modes.py):
        # the embedder masks wherever the pipeline asked, whatever the task
        enc = self.backbone(batch, pool=any(s.needs_pooled for s in specs),
                            visual_masking=any(s.masks_visual_tokens for s in specs)
                            or bs.MVM_APPLY in batch)
        out: dict[str, torch.Tensor] = {}
        total = None
        for name, spec in zip(names, specs):
            terms = spec.compute(self.heads[spec.head_name], enc, batch)
            w = 1.0 if weights is None else weights.get(name, 1.0)
            for k, v in terms.items():
                if k.endswith("_loss"):
                    total = w * v if total is None else total + w * v
            out.update(terms)
        out.update({k[len(METRIC_PREFIX):]: v.detach() for k, v in enc.extras.items()
                    if k.startswith(METRIC_PREFIX)})
        out["loss"] = total
        return out

    def set_activation_checkpointing(self, on: bool = True) -> None:
        self.backbone.set_activation_checkpointing(on)

    def encode(self, batch: Mapping[str, torch.Tensor], pool: bool = True) -> EncoderOutput:
        """Backbone outputs for downstream heads (no masking; pooled [CLS] included)."""
        return self.backbone(batch, pool=pool)

    def num_parameters(self, exclude_word_embeddings: bool = False) -> int:
        total = sum(p.numel() for p in self.parameters())
        if exclude_word_embeddings:  # how the papers count (UNITER-base: 86M)
            total -= self.backbone.text_embeddings.word_embeddings.weight.numel()
        return total
