"""``DataConfig``: the typed configuration of the pretraining data pipeline.

A later platform config embeds it (its ``data`` section maps onto these fields). Every field is
validated on construction; every problem names its dotted key, and all problems are reported
at once in one :class:`DataConfigError`. Checks that need the file system (source folders
exist and hold shards, feature widths agree, soft labels present for the tasks that need
them) happen in :func:`vlp.datasets.stream.data_plan.plan_data`, still before any row is read.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Iterator, Literal, Mapping

from vlp.datasets.stream.location import LOCATION_ALIASES, LOCATION_FEATURES, location_kind


class DataConfigError(ValueError):
    """One or more data-config problems, each ``(dotted key, what was expected)``."""

    def __init__(self, problems: list[tuple[str, str]]):
        self.problems = list(problems)
        lines = [f"{k}: {m}" for k, m in self.problems]
        super().__init__("invalid data config: " + (lines[0] if len(lines) == 1 else
                                                   "\n  " + "\n  ".join(lines)))


@dataclass(frozen=True)
class SourceConfig:
    """A folder of image shards (searched recursively) and its sampling weight.

    Weights are relative shares of the *examples* in the stream: with weights coco 2, cc 1,
    two thirds of the examples come from coco whatever the folders' sizes; one epoch keeps
    the total number of examples of all sources (sources are up- or down-sampled).
    """
    name: str
    path: str
    weight: float = 1.0


@dataclass(frozen=True)
class RegionConfig:
    """UNITER's region selection: detector confidence > threshold, at least ``min_regions``
    and at most ``max_regions`` (images with none above the threshold get the top
    ``min_regions``); or the top ``fixed_regions`` by confidence (36 in BUTD's fixed set)."""
    conf_threshold: float = 0.2
    min_regions: int = 10
    max_regions: int = 100
    fixed_regions: int | None = None

    def max_per_image(self) -> int:
        return self.fixed_regions if self.fixed_regions is not None else self.max_regions


@dataclass(frozen=True)
class PixelConfig:
    """SOHO's end-to-end input. The paper resizes to shorter side 600 / longer ≤ 1000; the
    defaults are small because the synthetic world renders small scenes."""
    shorter_side: int = 96
    longer_max: int = 160
    pad_multiple: int = 32            # the CNN's stride: padded sizes divide evenly
    token_stride: int = 64            # ResNet stride 32 + SOHO's 2×2 max-pool: one visual token
                                      # per 64×64 pixels (counts input units for the budget)
    mean: tuple[float, float, float] = (0.485, 0.456, 0.406)   # ImageNet statistics
    std: tuple[float, float, float] = (0.229, 0.224, 0.225)
    pos_texts_per_image: int = 2      # SOHO: each image forwarded once with 2 positive texts
    neg_texts_per_image: int = 2      #   and 2 negative texts


@dataclass(frozen=True)
class DataConfig:
    sources: tuple[SourceConfig, ...]
    split: str | None = "train"       # image rows of other splits are skipped (no eval leakage)
    tokenizer_path: str | None = None  # folder with tokenizer.json or vocab.txt, or a file;
                                       # None = the packaged MiniLM uncased vocab
    max_text_len: int = 60            # word pieces, without [CLS]/[SEP]
    overlong: Literal["drop", "truncate"] = "drop"   # UNITER drops captions over 60 tokens
    regions: RegionConfig = field(default_factory=RegionConfig)
    location: str = "uniter7"         # uniter7 / imagebert5 / box4 (VL-BERT), or the family
                                      # aliases uniter / imagebert / vlbert
    image_feat: bool = False          # emit the whole-image feature (VL-BERT)
    text_segment_types: tuple[int, ...] = ()   # token type of each [SEP]-separated part of a
                                      # caption (UNITER VCR stage 2: question 0, answer 2,
                                      # rationale 3); () = no type ids (every token type 0)
    visual: Literal["regions", "pixels"] = "regions"   # pixels = SOHO's end-to-end input
    masking: Literal["conditional", "joint"] = "conditional"
    mask_prob: float = 0.15
    text_corpus: str | None = None    # folder of .txt files (a passage a line) for mlm-text
    object_words: tuple[str, ...] = ()   # words naming objects, the targets of mlm-obj;
                                      # () = the class names in the sources' world manifest
    itm_neg_prob: float = 0.5
    batch_units: int = 4096           # per worker per batch: B × the longest packed row
                                      # (text + regions; pixels: B × (T + visual tokens))
    bucket_window: int = 4096         # examples sorted by length together (UNITER: 8192); the
                                      # window holds their images, so memory ∝ this
    bucketing: bool = True            # False: cut the window in random order (a baseline)
    cache: Literal["auto", "always", "never"] = "auto"   # keep the transformed rows in Ray's
                                      # object store after one pass: no per-epoch Ray Data
                                      # restart (seconds); auto = when the shards take under a
                                      # quarter of the object store
    read_rows: int = 32               # image rows per Arrow block of the local reader (the
                                      # Ray stream hands over Ray Data's own blocks)
    prefetch_blocks: int = 8          # blocks queued ahead of the batcher (bounds host memory)
    seed: int = 0
    pixels: PixelConfig = field(default_factory=PixelConfig)

    def __post_init__(self):
        if isinstance(self.location, str):
            object.__setattr__(self, "location", location_kind(self.location))
        problems = list(self.validate())
        if problems:
            raise DataConfigError(problems)

    # ---- validation -----------------------------------------------------------------------

    def validate(self) -> Iterator[tuple[str, str]]:
        if not self.sources:
            yield "sources", "expected at least one source (name, path, weight)"
        names = set()
        for i, s in enumerate(self.sources):
            key = f"sources.{s.name or i}"
            if not isinstance(s, SourceConfig):
                yield f"sources.{i}", f"expected a SourceConfig, got {type(s).__name__}"
                continue
            if not s.name:
                yield f"{key}.name", "expected a non-empty source name"
            if s.name in names:
                yield f"{key}.name", f"duplicate source name {s.name!r}"
            names.add(s.name)
            if not s.path:
                yield f"{key}.path", "expected a folder path, got ''"
            if not _finite(s.weight) or s.weight < 0:
                yield f"{key}.weight", f"expected a sampling weight ≥ 0, got {s.weight!r}"
        if self.sources and all(_finite(s.weight) and s.weight == 0 for s in self.sources):
            yield "sources", "all source weights are 0: at least one must be positive"
        if self.split is not None and self.split not in ("train", "val", "test"):
            yield "split", f"expected 'train', 'val', 'test' or null, got {self.split!r}"
        if not _int(self.max_text_len) or self.max_text_len < 1:
            yield "max_text_len", f"expected an integer ≥ 1, got {self.max_text_len!r}"
        if self.overlong not in ("drop", "truncate"):
            yield "overlong", f"expected 'drop' or 'truncate', got {self.overlong!r}"
        yield from _prefixed("regions", _validate_regions(self.regions))
        if self.location not in LOCATION_FEATURES:
            yield "location", (f"unknown location kind {self.location!r}; known: "
                               f"{', '.join([*LOCATION_FEATURES, *LOCATION_ALIASES])}")
        if self.visual not in ("regions", "pixels"):
            yield "visual", f"expected 'regions' or 'pixels', got {self.visual!r}"
        if any(not _int(t) or t < 0 for t in self.text_segment_types):
            yield "text_segment_types", (f"expected token type ids ≥ 0, got "
                                         f"{list(self.text_segment_types)!r}")
        if self.masking not in ("conditional", "joint"):
            yield "masking", f"expected 'conditional' or 'joint', got {self.masking!r}"
        if self.cache not in ("auto", "always", "never"):
            yield "cache", f"expected 'auto', 'always' or 'never', got {self.cache!r}"
        if not _finite(self.mask_prob) or not 0 < self.mask_prob < 1:
            yield "mask_prob", f"expected a probability in (0, 1), got {self.mask_prob!r}"
        bad = [w for w in self.object_words if not isinstance(w, str) or not w.strip()]
        if bad:
            yield "object_words", f"expected non-empty words, got {bad[0]!r}"
        if not _finite(self.itm_neg_prob) or not 0 <= self.itm_neg_prob <= 1:
            yield "itm_neg_prob", f"expected a probability in [0, 1], got {self.itm_neg_prob!r}"
        for name in ("bucket_window", "read_rows", "prefetch_blocks"):
            v = getattr(self, name)
            if not _int(v) or v < 1:
                yield name, f"expected an integer ≥ 1, got {v!r}"
        if not _int(self.seed) or self.seed < 0:
            yield "seed", f"expected an integer ≥ 0, got {self.seed!r}"
        yield from _prefixed("pixels", _validate_pixels(self.pixels))
        if not _int(self.batch_units) or self.batch_units < 1:
            yield "batch_units", f"expected an integer ≥ 1, got {self.batch_units!r}"
        elif _int(self.max_text_len) and self.batch_units < self.max_example_units():
            yield "batch_units", (f"is {self.batch_units} but one example can take "
                                  f"{self.max_example_units()} input units "
                                  f"({self._example_units_text()}): expected at least that")

    def max_example_units(self) -> int:
        """The most input units one batch entry can take (the budget must hold one)."""
        text = self.max_text_len + 2
        if self.visual == "pixels":
            p = self.pixels
            side = math.ceil(p.longer_max / p.pad_multiple) * p.pad_multiple
            tokens = math.ceil(side / p.token_stride) ** 2   # a square image bounds any shape
            return (p.pos_texts_per_image + p.neg_texts_per_image) * (text + tokens)
        return text + self.regions.max_per_image()

    def _example_units_text(self) -> str:
        if self.visual == "pixels":
            return "one image's texts × (max text + visual tokens of the largest image)"
        return "max_text_len + [CLS]/[SEP] + the most regions per image"

    # ---- construction from / flattening to plain data -----------------------------------

    @classmethod
    def for_model(cls, preprocess: Any, sources: tuple[SourceConfig, ...], **overrides: Any
                  ) -> "DataConfig":
        """The config that feeds a model built by ``vlp.models.create_model``: its
        ``PreprocessSpec`` decides the visual input, location encoding, whole-image feature,
        vocabulary, text length and image sizes; ``overrides`` set any other field."""
        kw: dict[str, Any] = dict(
            visual=preprocess.input_kind,
            image_feat=bool(getattr(preprocess, "needs_image_feat", False)),
            tokenizer_path=getattr(preprocess, "vocab_file", None),
            max_text_len=min(60, int(preprocess.max_text_positions) - 2))
        if preprocess.location_kind:
            kw["location"] = preprocess.location_kind
        if preprocess.input_kind == "pixels" and preprocess.image_min_side:
            px = {"shorter_side": preprocess.image_min_side,
                  "longer_max": preprocess.image_max_side or preprocess.image_min_side}
            if preprocess.pixel_mean:
                px.update(mean=tuple(preprocess.pixel_mean), std=tuple(preprocess.pixel_std))
            kw["pixels"] = dataclasses.replace(overrides.pop("pixels", PixelConfig()), **px)
        kw.update(overrides)
        return cls(sources=tuple(sources), **kw)

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> "DataConfig":
        """Build from YAML-like data; ``sources`` is a list of {name, path, weight} or a
        mapping ``name → {path, weight}``. Unknown keys are errors naming the key."""
        problems: list[tuple[str, str]] = []
        kwargs = _known_keys(cls, raw, "", problems)
        srcs = raw.get("sources", ())
        if isinstance(srcs, Mapping):
            srcs = [{"name": k, **(v if isinstance(v, Mapping) else {"path": v})}
                    for k, v in srcs.items()]
        sources = []
        for i, s in enumerate(srcs):
            if not isinstance(s, Mapping):
                problems.append((f"sources.{i}", f"expected a mapping, got {s!r}"))
                continue
            sources.append(SourceConfig(**_known_keys(SourceConfig, s, f"sources.{i}.",
                                                      problems)))
        kwargs["sources"] = tuple(sources)
        for name, sub in (("regions", RegionConfig), ("pixels", PixelConfig)):
            if name in raw:
                if not isinstance(raw[name], Mapping):
                    problems.append((name, f"expected a mapping, got {raw[name]!r}"))
                    kwargs.pop(name)
                else:
                    inner = _known_keys(sub, raw[name], f"{name}.", problems)
                    for t in ("mean", "std"):
                        if t in inner:
                            inner[t] = tuple(inner[t])
                    kwargs[name] = sub(**inner)
        if problems:
            raise DataConfigError(problems)
        return cls(**kwargs)

    def to_flat_dict(self) -> dict[str, Any]:
        """``{"regions.min_regions": 10, "sources.coco.weight": 1.0, ...}`` for MLflow."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.name == "sources":
                for s in v:
                    out[f"sources.{s.name}.path"] = s.path
                    out[f"sources.{s.name}.weight"] = s.weight
            elif dataclasses.is_dataclass(v):
                for k, x in dataclasses.asdict(v).items():
                    out[f"{f.name}.{k}"] = x
            else:
                out[f.name] = v
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


# ---- helpers ------------------------------------------------------------------------------

def _validate_regions(r: RegionConfig) -> Iterator[tuple[str, str]]:
    if not _finite(r.conf_threshold) or not 0 <= r.conf_threshold < 1:
        yield "conf_threshold", f"expected a confidence in [0, 1), got {r.conf_threshold!r}"
    if not _int(r.min_regions) or r.min_regions < 1:
        yield "min_regions", f"expected an integer ≥ 1, got {r.min_regions!r}"
    if not _int(r.max_regions) or r.max_regions < 1:
        yield "max_regions", f"expected an integer ≥ 1, got {r.max_regions!r}"
    elif _int(r.min_regions) and r.max_regions < r.min_regions:
        yield "max_regions", f"is {r.max_regions}, below min_regions {r.min_regions}"
    if r.fixed_regions is not None and (not _int(r.fixed_regions) or r.fixed_regions < 1):
        yield "fixed_regions", f"expected an integer ≥ 1 or null, got {r.fixed_regions!r}"


def _validate_pixels(p: PixelConfig) -> Iterator[tuple[str, str]]:
    for name in ("shorter_side", "longer_max", "pad_multiple", "token_stride",
                 "pos_texts_per_image"):
        v = getattr(p, name)
        if not _int(v) or v < 1:
            yield name, f"expected an integer ≥ 1, got {v!r}"
    if not _int(p.neg_texts_per_image) or p.neg_texts_per_image < 0:
        yield "neg_texts_per_image", f"expected an integer ≥ 0, got {p.neg_texts_per_image!r}"
    if _int(p.shorter_side) and _int(p.longer_max) and p.longer_max < p.shorter_side:
        yield "longer_max", f"is {p.longer_max}, below shorter_side {p.shorter_side}"
    for name in ("mean", "std"):
        v = getattr(p, name)
        if len(v) != 3 or not all(_finite(x) for x in v):
            yield name, f"expected 3 numbers (RGB), got {v!r}"
    if len(p.std) == 3 and any(_finite(x) and x <= 0 for x in p.std):
        yield "std", f"expected positive numbers, got {p.std!r}"


def _prefixed(prefix: str, problems: Iterator[tuple[str, str]]) -> Iterator[tuple[str, str]]:
    for k, m in problems:
        yield f"{prefix}.{k}", m


def _known_keys(cls, raw: Mapping[str, Any], prefix: str,
                problems: list[tuple[str, str]]) -> dict[str, Any]:
    import difflib

    names = [f.name for f in dataclasses.fields(cls)]
    out = {}
    for k, v in raw.items():
        if k in names:
            out[k] = v
        else:
            close = difflib.get_close_matches(str(k), names, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            problems.append((f"{prefix}{k}", f"unknown key{hint}; known: {', '.join(names)}"))
    return out


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)
