"""``DataConfig``: the typed configuration of the pretraining data pipeline.

A later platform config embeds it (its ``data`` section maps onto these fields). Every field is
validated on construction; every problem names its dotted key, and all problems are reported
at once in one :class:`DataConfigError`. Checks that need the file system (source folders
exist and hold shards, feature widths agree, soft labels present for the tasks that need
them) happen in :func:`vlp.datasets.stream.data_plan.plan_data`, still before any row is read.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Iterator, Literal, Mapping

from pydantic import Field, field_validator

from vlp.contract.config_errors import ProblemsError
from vlp.contract.config_loader import ConfigModel, from_dict
from vlp.datasets.stream.location import LOCATION_ALIASES, LOCATION_FEATURES, location_kind

_Positive = Annotated[float, Field(gt=0)]


class DataConfigError(ProblemsError):
    """One or more data-config problems, each ``(dotted key, what was expected)``."""

    title = "invalid data config"


class SourceConfig(ConfigModel, frozen=True):
    """A folder of image shards (searched recursively) and its sampling weight.

    Weights are relative shares of the *examples* in the stream: with weights coco 2, cc 1,
    two thirds of the examples come from coco whatever the folders' sizes; one epoch keeps
    the total number of examples of all sources (sources are up- or down-sampled).
    """
    error = DataConfigError
    name: str
    path: str
    weight: float = 1.0     # checked by DataConfig, which names the source in the key


class RegionConfig(ConfigModel, frozen=True):
    """UNITER's region selection: detector confidence > threshold, at least ``min_regions``
    and at most ``max_regions`` (images with none above the threshold get the top
    ``min_regions``); or the top ``fixed_regions`` by confidence (36 in BUTD's fixed set)."""
    error = DataConfigError
    conf_threshold: float = Field(0.2, ge=0, lt=1)
    min_regions: int = Field(10, ge=1)
    max_regions: int = Field(100, ge=1)
    fixed_regions: int | None = Field(None, ge=1)

    def max_per_image(self) -> int:
        return self.fixed_regions if self.fixed_regions is not None else self.max_regions

    def validate(self) -> Iterator[tuple[str, str]]:
        if self.max_regions < self.min_regions:
            yield "max_regions", f"is {self.max_regions}, below min_regions {self.min_regions}"


# ---- each family's paper's region selection ------------------------------------------------
#
# The default wherever a run does not set ``regions`` (pretraining without a recipe, a sweep,
# finetuning), so that a family is never fed UNITER's rule by accident:
# - UNITER: detector confidence > 0.2, 10 to 100 regions (the reference code's BUTD
#   features; the paper states none): ``RegionConfig()``'s defaults;
# - VL-BERT: "at most 100 RoIs with detection scores higher than 0.5, and at least 10 RoIs"
#   (§4.1);
# - ImageBERT: "the top-100 ranked objects ordered by confidence scores" (§5.3; §5.1: 144
#   positions, 100 of them visual);
# - SOHO reads pixels: no regions.
# A family's kind is the first part of its registered name (``vlbert-base`` → vlbert; every
# registered family is named so, tests/test_family_defaults.py checks it), so that configs
# can be completed without importing the model zoo.

FAMILY_REGIONS = {
    "uniter": RegionConfig(),
    "vlbert": RegionConfig(conf_threshold=0.5, min_regions=10, max_regions=100),
    "imagebert": RegionConfig(fixed_regions=100),
}


def family_kind(family: str) -> str:
    """``uniter-base`` → ``uniter``: the embedder kind the family's name starts with."""
    return family.split("-", 1)[0]


def family_regions(family: str) -> RegionConfig:
    """The region selection of ``family``'s paper (UNITER's rule for an unknown kind)."""
    return FAMILY_REGIONS.get(family_kind(family), RegionConfig())


class PixelConfig(ConfigModel, frozen=True):
    """SOHO's end-to-end input. The paper resizes to shorter side 600 / longer ≤ 1000; the
    defaults are small because the synthetic world renders small scenes."""
    error = DataConfigError
    shorter_side: int = Field(96, ge=1)
    longer_max: int = Field(160, ge=1)
    pad_multiple: int = Field(32, ge=1)   # the CNN's stride: padded sizes divide evenly
    token_stride: int = Field(64, ge=1)   # ResNet stride 32 + SOHO's 2×2 max-pool: one visual
                                      # token per 64×64 pixels (counts input units for the budget)
    mean: tuple[float, float, float] = (0.485, 0.456, 0.406)   # ImageNet statistics
    std: tuple[_Positive, _Positive, _Positive] = (0.229, 0.224, 0.225)
    pos_texts_per_image: int = Field(2, ge=1)   # SOHO: each image forwarded once with 2
    neg_texts_per_image: int = Field(2, ge=0)   #   positive texts and 2 negative texts

    def validate(self) -> Iterator[tuple[str, str]]:
        if self.longer_max < self.shorter_side:
            yield "longer_max", f"is {self.longer_max}, below shorter_side {self.shorter_side}"


def batch_units_field(**kw: Any) -> Any:
    """``batch_units``: per worker per batch, B × the longest packed row (text + regions;
    pixels: B × (T + visual tokens)). One definition for both names it goes by."""
    return Field(4096, ge=1, **kw)


class PipelineOptions(ConfigModel):
    """The pipeline options a run sets: ``DataConfig`` adds what the model decides, the
    pretraining config's ``data`` section adds named sources. Both check them here."""
    split: Literal["train", "val", "test"] | None = "train"   # image rows of other splits are
                                      # skipped (no eval leakage)
    tokenizer_path: str | None = None  # folder with tokenizer.json or vocab.txt, or a file;
                                       # None = the packaged MiniLM uncased vocab
    max_text_len: int = Field(60, ge=1)   # word pieces, without [CLS]/[SEP]
    overlong: Literal["drop", "truncate"] = "drop"   # UNITER drops captions over 60 tokens
    regions: RegionConfig = Field(default_factory=RegionConfig)
    masking: Literal["conditional", "joint"] = "conditional"
    mask_prob: float = Field(0.15, gt=0, lt=1)
    text_corpus: str | None = None    # folder of .txt files (a passage a line) for mlm-text
    object_words: tuple[str, ...] = ()   # words naming objects, the targets of mlm-obj;
                                      # () = the class names in the sources' world manifest
    itm_neg_prob: float = Field(0.5, ge=0, le=1)
    batch_units: int = batch_units_field()
    # per worker per batch, at most this many examples (image-text pairs) beside the units
    # budget; 0 = none. A paper that gives its batch in pairs (VL-BERT §4.1: 256) holds it
    # whatever the rows' lengths, the units budget then only bounds memory
    batch_examples: int = Field(0, ge=0)
    bucket_window: int = Field(4096, ge=1)   # examples sorted by length together (UNITER:
                                      # 8192); the window holds their images, so memory ∝ this
    bucketing: bool = True            # False: cut the window in random order (a baseline)
    fixed_shapes: bool = False        # region batches in a few fixed shapes (CUDA graphs):
                                      # rows × a width from a ladder fitted to the first
                                      # window, padded (batching/fixed_shapes.py)
    shape_buckets: int = Field(12, ge=1, le=64)   # widths fitted (+1 for the longest rows)
    cache: Literal["auto", "always", "never"] = "auto"   # keep the transformed rows in Ray's
                                      # object store after one pass: no per-epoch Ray Data
                                      # restart (seconds); auto = when the shards take under a
                                      # quarter of the object store
    read_rows: int = Field(32, ge=1)  # image rows per Arrow block of the local reader (the
                                      # Ray stream hands over Ray Data's own blocks)
    prefetch_blocks: int = Field(8, ge=1)   # blocks queued ahead of the batcher (bounds host
                                            # memory)
    # per_worker: each worker batches its own share of the data (Ray Data's streaming
    # split); a resume must keep the number of workers. global: every worker reads the whole
    # stream and cuts the same batches, worker r of W trains batches r, r + W, ...: the
    # batch sequence and the saved position do not depend on W, so a run resumes on another
    # number of workers (batching/batch_stream.py). Costs each worker the reading and cutting
    # of all W workers' batches (not their masking)
    stream: Literal["per_worker", "global"] = "per_worker"

    def validate(self) -> Iterator[tuple[str, str]]:
        bad = [w for w in self.object_words if not w.strip()]
        if bad:
            yield "object_words", f"expected non-empty words, got {bad[0]!r}"
        if self.batch_units < self.max_example_units():
            yield "batch_units", (f"is {self.batch_units} but one example can take "
                                  f"{self.max_example_units()} input units "
                                  f"({self._example_units_text()}): expected at least that")

    def max_example_units(self) -> int:
        """The most input units one batch entry can take (the budget must hold one)."""
        return self.max_text_len + 2 + self.regions.max_per_image()

    def _example_units_text(self) -> str:
        return "max_text_len + [CLS]/[SEP] + the most regions per image"


class DataConfig(PipelineOptions, frozen=True):
    error = DataConfigError
    validate_on_init = True           # the pipeline trusts a DataConfig it is handed
    sources: tuple[SourceConfig, ...]
    location: str = "uniter7"         # uniter7 / imagebert5 / box4 (VL-BERT), or the family
                                      # aliases uniter / imagebert / vlbert
    image_feat: bool = False          # emit the whole-image feature (VL-BERT)
    text_segment_types: tuple[Annotated[int, Field(ge=0)], ...] = ()   # token type of each
                                      # [SEP]-separated part of a caption (UNITER VCR stage 2:
                                      # question 0, answer 2, rationale 3); () = no type ids
    visual: Literal["regions", "pixels"] = "regions"   # pixels = SOHO's end-to-end input
    seed: int = Field(0, ge=0)
    pixels: PixelConfig = Field(default_factory=PixelConfig)

    @field_validator("location", mode="before")
    @classmethod
    def _location_alias(cls, v: Any) -> Any:
        return location_kind(v) if isinstance(v, str) else v

    @field_validator("sources", mode="before")
    @classmethod
    def _sources_by_name(cls, v: Any) -> Any:
        """YAML may name the sources: ``{coco: {path, weight}}`` or ``{coco: path}``."""
        if isinstance(v, Mapping):
            return [{"name": k, **(s if isinstance(s, Mapping) else {"path": s})}
                    for k, s in v.items()]
        return v

    # ---- validation -----------------------------------------------------------------------

    def validate(self) -> Iterator[tuple[str, str]]:
        """Beyond the fields' own types and limits (checked by pydantic)."""
        if not self.sources:
            yield "sources", "expected at least one source (name, path, weight)"
        names = set()
        for i, s in enumerate(self.sources):
            key = f"sources.{s.name or i}"
            if not s.name:
                yield f"{key}.name", "expected a non-empty source name"
            if s.name in names:
                yield f"{key}.name", f"duplicate source name {s.name!r}"
            names.add(s.name)
            if not s.path:
                yield f"{key}.path", "expected a folder path, got ''"
            if not math.isfinite(s.weight) or s.weight < 0:
                yield f"{key}.weight", f"expected a sampling weight ≥ 0, got {s.weight!r}"
        if self.sources and all(s.weight == 0 for s in self.sources):
            yield "sources", "all source weights are 0: at least one must be positive"
        if self.location not in LOCATION_FEATURES:
            yield "location", (f"unknown location kind {self.location!r}; known: "
                               f"{', '.join([*LOCATION_FEATURES, *LOCATION_ALIASES])}")
        # sections handed in built (not loaded) have had their own rules checked here only
        for name in ("regions", "pixels"):
            yield from ((f"{name}.{k}", m) for k, m in getattr(self, name).validate())
        if self.fixed_shapes and self.visual == "pixels":
            yield "fixed_shapes", ("applies to region input only (pixel batches, SOHO, are "
                                   "not cut into fixed shapes yet): expected false")
        yield from super().validate()

    def max_example_units(self) -> int:
        """The most input units one batch entry can take (the budget must hold one)."""
        if self.visual == "pixels":
            p = self.pixels
            text = self.max_text_len + 2
            side = math.ceil(p.longer_max / p.pad_multiple) * p.pad_multiple
            tokens = math.ceil(side / p.token_stride) ** 2   # a square image bounds any shape
            return (p.pos_texts_per_image + p.neg_texts_per_image) * (text + tokens)
        return super().max_example_units()

    def _example_units_text(self) -> str:
        if self.visual == "pixels":
            return "one image's texts × (max text + visual tokens of the largest image)"
        return super()._example_units_text()

    # ---- construction from / flattening to plain data -----------------------------------

    @classmethod
    def for_model(cls, preprocess: Any, sources: tuple[SourceConfig, ...], **overrides: Any
                  ) -> "DataConfig":
        """The config that feeds a model built by ``vlp.models.create_model``: its
        ``PreprocessSpec`` decides the visual input, location encoding, whole-image feature,
        vocabulary, text length and image sizes, and its family the region selection unless
        ``regions`` is given (``family_regions``); ``overrides`` set any other field."""
        kw: dict[str, Any] = dict(
            visual=preprocess.input_kind,
            image_feat=bool(getattr(preprocess, "needs_image_feat", False)),
            tokenizer_path=getattr(preprocess, "vocab_file", None),
            max_text_len=min(60, int(preprocess.max_text_positions) - 2))
        if preprocess.location_kind:
            kw["location"] = preprocess.location_kind
        if overrides.get("regions", 0) is None:
            del overrides["regions"]            # null: not given
        if preprocess.input_kind == "regions" and "regions" not in overrides:
            kw["regions"] = family_regions(preprocess.family)   # the family's paper's
        if preprocess.input_kind == "pixels" and preprocess.image_min_side:
            px = {"shorter_side": preprocess.image_min_side,
                  "longer_max": preprocess.image_max_side or preprocess.image_min_side}
            if preprocess.pixel_mean:
                px.update(mean=tuple(preprocess.pixel_mean), std=tuple(preprocess.pixel_std))
            kw["pixels"] = overrides.pop("pixels", PixelConfig()).model_copy(update=px)
        kw.update(overrides)
        return cls(sources=tuple(sources), **kw)

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> "DataConfig":
        """Build from YAML-like data; ``sources`` is a list of {name, path, weight} or a
        mapping ``name → {path, weight}``. Unknown keys are errors naming the key."""
        return from_dict(cls, raw)

    def to_flat_dict(self) -> dict[str, Any]:
        """``{"regions.min_regions": 10, "sources.coco.weight": 1.0, ...}`` for MLflow."""
        out: dict[str, Any] = {}
        for name in type(self).model_fields:
            v = getattr(self, name)
            if name == "sources":
                for s in v:
                    out[f"sources.{s.name}.path"] = s.path
                    out[f"sources.{s.name}.weight"] = s.weight
            elif isinstance(v, ConfigModel):
                out.update({f"{name}.{k}": x for k, x in v.model_dump().items()})
            else:
                out[name] = v
        return out


def world_sources(world: str, names: list[str] | None = None,
                  weights: Mapping[str, float] | None = None, domain: str | None = None
                  ) -> tuple[SourceConfig, ...]:
    """The pretraining sources of a vlp world (``manifest.json``): every in-/out-of-domain
    source, or ``names``, or one ``domain`` ("in" / "out"); weight 1 unless given."""
    from vlp.datasets.storage.world import load_manifest

    m = load_manifest(world)
    names = names or m.pretraining_sources(domain)
    missing = [n for n in names if n not in m.sources]
    if missing:
        raise DataConfigError([(f"sources.{n}", f"the world {world} has no source {n!r}; it "
                                                f"has {', '.join(m.sources)}") for n in missing])
    weights = weights or {}
    return tuple(SourceConfig(n, str(m.path(m.sources[n].folder)), float(weights.get(n, 1.0)))
                 for n in names)
