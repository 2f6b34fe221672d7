"""What a pretraining task is: the ``Task`` base class a task file subclasses.

A task's class attributes are its spec — the name its loss is reported under, its label in
sweep and leaderboard mix labels, the modality it masks, the visual inputs it works with, what
its batches need from the data — and its three methods are the rest of it: ``mask`` (the
masking policy, run in the data pipeline on numpy arrays), ``build_head`` and ``compute`` (the
head and the loss, run in the model on the backbone's
:class:`~vlp.contract.encoder_output.EncoderOutput`). Tasks that share a head — MRC and MRC-kl
share UNITER's ``region_classifier``, WRA adds to ITM's — name the same ``head_name``. Only
SOHO's MVM masks inside the model (``masks_visual_tokens``): its mask depends on the visual
dictionary, which the pipeline does not have.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal, Mapping

import numpy as np
import torch
from torch import nn

from vlp.contract.encoder_output import EncoderOutput

Batch = Mapping[str, torch.Tensor]        # a model-side batch (see ``vlp.contract.batch_spec``)
ArrayBatch = dict[str, np.ndarray]         # a pipeline-side batch, masked in place
VISUAL_INPUTS = frozenset({"regions", "pixels"})
MODALITIES = ("text", "regions", "pixels")


@dataclass(frozen=True)
class MaskContext:
    mask_prob: float          # share of tokens / regions masked (15%)
    mask_id: int
    cls_id: int
    sep_id: int
    random_ids: np.ndarray    # MLM's "random token" draws come from these ids
    object_ids: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
                              # word pieces that name a detector class (mlm-obj's targets)


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
    """Subclass, set the spec below, override ``mask`` (unless the task masks nothing),
    ``build_head`` and ``compute``, and decorate with ``vlp.tasks.registry.register``."""

    # ---- what it is (required: the registry checks that a task sets them) ----------------
    name: ClassVar[str]                   # reported as ``{name}_loss``
    label: ClassVar[str]                  # in mix labels: "MLM+ITM+MRC-kl"
    head_name: ClassVar[str]              # tasks naming the same head share it
    visual: ClassVar[frozenset[str]]      # visual inputs it works with: "regions", "pixels"
    modality: ClassVar[Literal["text", "regions", "pixels"] | None]   # what it masks
                                          # (None: nothing, e.g. ITM)
    # ---- optional ---------------------------------------------------------------------------
    order: ClassVar[int] = 1000           # place in a mix label (Table 3's reading order)
    families: ClassVar[frozenset[str] | None] = None   # model kinds it applies to
                                          # (FamilyConfig.visual.kind); None: every family
                                          # whose visual input it works with
    needs_soft_labels: ClassVar[bool] = False   # detector class distributions (MRC, MOC)
    itm_negatives: ClassVar[bool] = False       # the batch holds swapped negative pairs
    negatives_swap: ClassVar[Literal["image_or_text", "text"]] = "image_or_text"   # what a
                                          # negative takes from its donor (SIRP: the caption)
    image_feat: ClassVar[bool] = False    # the task needs the whole-image feature (VL-BERT)
    object_words: ClassVar[bool] = False  # the task masks the words naming objects (mlm-obj)
    text_only: ClassVar[bool] = False     # batches from the text corpus, no image (mlm-text)
    needs_pooled: ClassVar[bool] = False         # the backbone runs its pooler
    masks_visual_tokens: ClassVar[bool] = False  # the embedder masks visual tokens (MVM)

    def mask(self, batch: ArrayBatch, rng: np.random.Generator, ctx: MaskContext) -> None:
        """Mask ``batch`` in place and add the task's targets; only positive pairs get any."""

    def share_mask(self, batch: ArrayBatch, raw_feats: np.ndarray) -> None:
        """Add this task's targets for the positions another task of its forward group has
        already masked in this task's modality (``raw_feats``: the region input before any
        masking). A task that cannot follow another's mask refuses, naming itself."""
        raise ValueError(f"task {self.name!r} draws its own {self.modality} mask: it cannot "
                         f"share one with another task of its forward group")

    def build_head(self, ctx: HeadContext) -> nn.Module:
        raise NotImplementedError

    def compute(self, head: nn.Module, enc: EncoderOutput, batch: Batch) -> dict[str, torch.Tensor]:
        raise NotImplementedError
