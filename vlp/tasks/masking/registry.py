"""The policy registry, the masking context and the two masking modes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Literal

import numpy as np

Batch = dict[str, np.ndarray]


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
class MaskingPolicy:
    name: str
    modality: Literal["text", "regions", "pixels"] | None   # what it masks (None: ITM)
    visual: frozenset[str]            # visual inputs it works with: "regions", "pixels"
    apply: Callable[[Batch, np.random.Generator, MaskContext], None]
    needs_soft_labels: bool = False   # detector class distributions (MRC family, MOC)
    itm_negatives: bool = False       # the batch holds swapped negative pairs (ITM)
    negatives_swap: Literal["image_or_text", "text"] = "image_or_text"   # what a negative
                                      # takes from its donor (VL-BERT's SIRP: the caption)
    image_feat: bool = False          # the task needs the whole-image feature (VL-BERT)
    object_words: bool = False        # the task masks the words naming objects (mlm-obj)
    text_only: bool = False           # batches from the text corpus, no image (mlm-text)


MASKING_POLICIES: dict[str, MaskingPolicy] = {}


def register_policy(policy: MaskingPolicy) -> MaskingPolicy:
    if policy.name in MASKING_POLICIES:
        raise ValueError(f"masking policy {policy.name!r} is already registered")
    MASKING_POLICIES[policy.name] = policy
    return policy


def get_policy(name: str) -> MaskingPolicy:
    try:
        return MASKING_POLICIES[name]
    except KeyError:
        raise KeyError(f"unknown task {name!r}; known tasks: "
                       f"{', '.join(MASKING_POLICIES)}") from None


def apply_masking(task: str, batch: Batch, rng: np.random.Generator, ctx: MaskContext,
                  mode: Literal["conditional", "joint"], visual: str) -> None:
    policy = get_policy(task)
    policy.apply(batch, rng, ctx)
    if mode == "joint" and policy.modality is not None:
        # joint masking: the other modality is masked in the same examples as well, so the
        # task's targets are predicted without full observation of the other side
        from vlp.tasks.masking.partner import mask_partner_modality
        mask_partner_modality(policy.modality, batch, rng, ctx, visual)
