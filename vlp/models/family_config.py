"""Typed configs of a model family: the Transformer, the visual input, and the family itself.

A family is data (:data:`vlp.models.families.FAMILIES`): a name, a :class:`TransformerConfig`,
one visual-input config (which embedder kind builds the visual tokens and with what sizes);
the pretraining tasks that apply to it are the task registry's (``vlp.tasks.family_tasks``).
Sizes that depend on the data set rather than on the architecture (region feature width D,
detector class count C, vocabulary size) are arguments of :func:`vlp.models.create_model`,
not part of the family.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping

from transformers import BertConfig

from vlp.models.vision.resnet_config import (  # noqa: F401 (re-exported)
    RESNET18, RESNET101, RESNET_TINY, ResNetConfig)
from vlp.tasks.mrfr import REDUCTIONS as MRFR_REDUCTIONS
from vlp.tasks.registry import family_tasks

ATTN_IMPLEMENTATIONS = ("sdpa", "eager", "flash_attention_2", "flex_attention")
ATTENTION_LAYOUTS = ("padded", "varlen")   # transformer.attention (varlen_attention.py)
OBJECTIVES = ("sampled", "summed")   # how a family's pretraining combines its tasks
TOP_LEVEL_KEYS = ("mrfr_reduction",)    # FamilyConfig fields an override may name


@dataclass(frozen=True)
class TransformerConfig:
    """A post-LN BERT encoder (the backbone of every family)."""

    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    vocab_size: int = 30522
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    hidden_dropout: float = 0.1
    attention_dropout: float = 0.1
    layer_norm_eps: float = 1e-12  # UNITER / BERT: every LayerNorm uses eps 1e-12
    initializer_range: float = 0.02
    attn_implementation: str = "sdpa"
    # the query, key and value projections as one product (fused_qkv.py); the same weights
    fused_qkv: bool = True
    # padded: attention over whole packed rows with a padding mask; varlen: over each row's
    # real tokens only (varlen_attention.py: CUDA's variable-length kernels, dropout kept)
    attention: str = "padded"

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_heads:
            raise ValueError(f"transformer.hidden_size={self.hidden_size} is not a multiple of "
                             f"transformer.num_heads={self.num_heads}")
        if self.attn_implementation not in ATTN_IMPLEMENTATIONS:
            raise ValueError(f"transformer.attn_implementation={self.attn_implementation!r}: "
                             f"expected one of {ATTN_IMPLEMENTATIONS}")
        if self.attention not in ATTENTION_LAYOUTS:
            raise ValueError(f"transformer.attention={self.attention!r}: expected one of "
                             f"{ATTENTION_LAYOUTS}")
        if self.attention == "varlen" and self.attn_implementation != "sdpa":
            raise ValueError(f"transformer.attention='varlen' runs its own kernels (SDPA on "
                             f"nested jagged tensors) and cannot be combined with "
                             f"transformer.attn_implementation={self.attn_implementation!r}: "
                             f"leave it 'sdpa'")
        for name in ("hidden_dropout", "attention_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"transformer.{name}={getattr(self, name)} is not in [0, 1)")

    def to_bert_config(self) -> BertConfig:
        # Built from scratch, never from_pretrained: nothing is fetched from a hub.
        return BertConfig(
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            num_hidden_layers=self.num_layers,
            num_attention_heads=self.num_heads,
            intermediate_size=self.intermediate_size,
            hidden_act="gelu",  # exact (erf) GELU, as BERT and UNITER
            hidden_dropout_prob=self.hidden_dropout,
            attention_probs_dropout_prob=self.attention_dropout,
            max_position_embeddings=self.max_position_embeddings,
            type_vocab_size=self.type_vocab_size,
            initializer_range=self.initializer_range,
            layer_norm_eps=self.layer_norm_eps,
            attn_implementation=self.attn_implementation,
        )


@dataclass(frozen=True)
class UniterVisualConfig:
    """UNITER regions: LN(Linear feat) + LN(Linear 7-d location) + token type 1, then LN."""

    kind: str = field(default="uniter", init=False)
    location_width: int = 7
    input_kind: str = field(default="regions", init=False)
    location_kind: str = field(default="uniter7", init=False)


@dataclass(frozen=True)
class ImageBertVisualConfig:
    """ImageBERT regions: LN(Linear feat + Linear 5-d location + segment + dummy position)."""

    kind: str = field(default="imagebert", init=False)
    location_width: int = 5
    input_kind: str = field(default="regions", init=False)
    location_kind: str = field(default="imagebert5", init=False)


@dataclass(frozen=True)
class VLBertVisualConfig:
    """VL-BERT: a visual feature embedding on every token from [sine geometry; RoI feature]."""

    kind: str = field(default="vlbert", init=False)
    geometry_dim: int = 2048  # 4 box coordinates × (sin, cos) × geometry_dim / 8 wavelengths
    location_width: int = 4
    input_kind: str = field(default="regions", init=False)
    location_kind: str = field(default="box4", init=False)

    def __post_init__(self) -> None:
        if self.geometry_dim % 8:
            raise ValueError(f"visual.geometry_dim={self.geometry_dim} is not a multiple of 8")


@dataclass(frozen=True)
class SohoVisualConfig:
    """SOHO pixels: ResNet → 1×1 conv → 2×2 max-pool → visual dictionary → + 2-D sine
    position."""

    kind: str = field(default="soho", init=False)
    resnet: ResNetConfig = RESNET18
    dictionary_size: int = 2048
    dictionary_momentum: float = 0.4  # γ in d ← γ d + (1 − γ) mean(assigned); the reference's
    # data (vlp's default): entries = features of the first training batch (their scale);
    # normal: N(0, 1), the paper's ("randomly initialized", SOHO §3.2)
    dictionary_init: str = "data"
    image_min_side: int = 600  # shorter side resized to this, longer side capped (paper)
    image_max_side: int = 1000
    pixel_mean: tuple[float, float, float] = (0.485, 0.456, 0.406)  # ImageNet statistics
    pixel_std: tuple[float, float, float] = (0.229, 0.224, 0.225)
    location_width: None = field(default=None, init=False)
    input_kind: str = field(default="pixels", init=False)
    location_kind: None = field(default=None, init=False)

    def __post_init__(self) -> None:
        if not 0.0 <= self.dictionary_momentum < 1.0:
            raise ValueError(f"visual.dictionary_momentum={self.dictionary_momentum} "
                             "is not in [0, 1)")
        if self.dictionary_init not in ("data", "normal"):
            raise ValueError(f"visual.dictionary_init={self.dictionary_init!r}: expected data "
                             "or normal")
        if self.dictionary_size < 2:
            raise ValueError(f"visual.dictionary_size={self.dictionary_size} must be ≥ 2")


VisualConfig = UniterVisualConfig | ImageBertVisualConfig | VLBertVisualConfig | SohoVisualConfig

# Each paper's objective, by embedder kind (docs/paper-fidelity.md cites the sections).
# UNITER: conditional masking, "each time we only mask one modality" (§3.2); one task per
# mini-batch drawn by ratio is its reference code's meta-loader (the paper names no sampling
# and no ratio). VL-BERT: "three pre-training tasks are exploited to incur loss" (§3.3), words
# and RoIs each masked at 15%, nowhere one modality at a time (UNITER §2 counts VL-BERT among
# the models "randomly masking both image regions and sentence words"); its reference code
# forwards each example once and sums the losses. ImageBERT: "four tasks simultaneously"
# (abstract). SOHO: Eq. 9, L = L_MLM + L_MVM + L_ITM.
PAPER_OBJECTIVE = {"uniter": "sampled", "vlbert": "summed", "imagebert": "summed",
                   "soho": "summed"}
# Tasks that share one batch (each modality masked once, by the group's first task of it) and
# one forward under summed. VL-BERT: all its tasks (joint masking, one forward per example).
# ImageBERT: MOC and MRFR over one masked region set m_I (§4.3 Tasks 2-3, written over the
# same m_I; MOC draws it: 15%, of those 90% zeroed and 10% kept); text stays conditional
# (§5.1 "we use conditional mask in MLM, MOC and MRFR").
FORWARD_GROUPS = {"vlbert": (("mlm", "mrc-vlbert", "sirp"),),
                  "imagebert": (("moc", "mrfr"),)}


@dataclass(frozen=True)
class FamilyConfig:
    """One registered model family."""

    name: str
    transformer: TransformerConfig
    visual: VisualConfig
    # the paper's pretraining objective (the experiment's train.objective default), "" = its
    # kind's (PAPER_OBJECTIVE): sampled = one task per micro-batch drawn by mix ratio;
    # summed = every task's loss on the same examples, one backward
    objective: str = ""
    # MRFR's loss (vlp/tasks/mrfr.py): sum-features = the papers' Σ over the feature width
    # per masked region (UNITER §3.2, ImageBERT §4.3); mean-elements = the reference code's
    # mean over regions × width
    mrfr_reduction: str = "sum-features"

    def __post_init__(self) -> None:
        if not self.objective:
            object.__setattr__(self, "objective", PAPER_OBJECTIVE[self.visual.kind])
        if self.objective not in OBJECTIVES:
            raise ValueError(f"family {self.name!r}: objective={self.objective!r}: expected "
                             f"one of {', '.join(OBJECTIVES)}")
        if self.mrfr_reduction not in MRFR_REDUCTIONS:
            raise ValueError(f"family {self.name!r}: mrfr_reduction={self.mrfr_reduction!r}: "
                             f"expected one of {', '.join(MRFR_REDUCTIONS)}")

    @property
    def forward_groups(self) -> tuple[tuple[str, ...], ...]:
        """The paper's tasks that share one masked batch and one forward under ``summed``
        (the experiment's train.forward_groups default; FORWARD_GROUPS)."""
        return FORWARD_GROUPS.get(self.visual.kind, ())

    @property
    def tasks(self) -> tuple[str, ...]:
        """The pretraining tasks that apply to this family: each task names the embedder
        kinds it applies to and the visual inputs it works with (``vlp.tasks``)."""
        return family_tasks(self.visual.kind, self.visual.input_kind)

    def replace(self, overrides: Mapping[str, Any]) -> "FamilyConfig":
        """Copy with dotted-key overrides, e.g. ``{"transformer.hidden_dropout": 0.0}``.

        An unknown key is an error naming it (a typo must not silently keep the default)."""
        transformer, visual = self.transformer, self.visual
        top = {}
        for key, value in overrides.items():
            if key in TOP_LEVEL_KEYS:
                top[key] = value
                continue
            section, _, name = key.partition(".")
            target = {"transformer": transformer, "visual": visual}.get(section)
            if target is None or not name or name not in {
                    f.name for f in dataclasses.fields(target) if f.init}:
                raise KeyError(f"unknown model config key {key!r} for family {self.name!r}")
            if section == "transformer":
                transformer = dataclasses.replace(transformer, **{name: value})
            else:
                visual = dataclasses.replace(visual, **{name: value})
        return dataclasses.replace(self, transformer=transformer, visual=visual, **top)
