"""``create_model``: one factory by family name, returning the model and its preprocessing.

    bundle = create_model("uniter-base", tasks=["mlm", "itm", "mrfr", "mrc-kl"], init="minilm")
    model, preprocess = bundle            # a NamedTuple; bundle.load_report says what loaded

``preprocess`` (:class:`PreprocessSpec`) is what the data pipeline needs to feed this model:
regions or pixels, the location encoding and width, D, C, vocabulary size and file, image sizes.
"""

from __future__ import annotations

import importlib.util
import logging
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, NamedTuple

from vlp.models.checkpoints import LoadReport, initialize, minilm_dir
from vlp.models.checkpoints.text_bert import MINILM_PACKAGE
from vlp.models.family_config import FamilyConfig
from vlp.models.families import FAMILIES, get_family
from vlp.models.model import VLPModel

log = logging.getLogger(__name__)

MINILM_VOCAB_SIZE = 30522


@dataclass(frozen=True)
class PreprocessSpec:
    family: str
    tasks: tuple[str, ...]
    input_kind: str                     # "regions" (detector features) or "pixels" (SOHO)
    location_kind: str | None           # "uniter7" | "imagebert5" | "box4" (see batch_spec)
    location_width: int | None          # L of region_loc
    region_feat_dim: int | None         # D of region_feats
    num_classes: int | None             # C of region_soft_labels (index 0 = background)
    vocab_size: int
    vocab_file: str | None              # the packaged uncased WordPiece vocab when it fits
    max_text_positions: int             # text positions the model can embed ([CLS]…[SEP])
    image_min_side: int | None = None   # SOHO: shorter side resized to this
    image_max_side: int | None = None   # SOHO: longer side capped at this
    pixel_mean: tuple[float, float, float] | None = None
    pixel_std: tuple[float, float, float] | None = None
    needs_image_feat: bool = False      # VL-BERT: the whole-image feature ``image_feat``


class ModelBundle(NamedTuple):
    model: VLPModel
    preprocess: PreprocessSpec
    load_report: LoadReport


def list_families() -> list[str]:
    return list(FAMILIES)


def preprocess_spec(family: FamilyConfig, tasks: tuple[str, ...], feat_dim: int,
                    num_classes: int) -> PreprocessSpec:
    visual, t = family.visual, family.transformer
    regions = visual.input_kind == "regions"
    vocab_file = None
    # without the package (a GPU machine given only the vocab), the data's tokenizer_path names it
    if t.vocab_size == MINILM_VOCAB_SIZE and importlib.util.find_spec(MINILM_PACKAGE):
        vocab_file = str(minilm_dir() / "vocab.txt")
    pixels = {}
    if not regions:
        pixels = dict(image_min_side=visual.image_min_side, image_max_side=visual.image_max_side,
                      pixel_mean=visual.pixel_mean, pixel_std=visual.pixel_std)
    return PreprocessSpec(
        family=family.name, tasks=tasks, input_kind=visual.input_kind,
        location_kind=visual.location_kind, location_width=visual.location_width,
        region_feat_dim=feat_dim if regions else None,
        num_classes=num_classes if regions else None,
        vocab_size=t.vocab_size, vocab_file=vocab_file,
        # VL-BERT spends two positions after the text: the shared [IMG] one and [END]'s
        max_text_positions=t.max_position_embeddings - (2 if visual.kind == "vlbert" else 0),
        needs_image_feat=visual.kind == "vlbert", **pixels)


def create_model(family: str, tasks: Iterable[str], init: str = "random", *,
                 region_feat_dim: int = 2048, num_classes: int = 1601,
                 vocab_size: int | None = None,
                 overrides: Mapping[str, Any] | None = None) -> ModelBundle:
    """Build a registered family with the heads of ``tasks`` and initialise it.

    ``init``: ``random`` | ``minilm`` | ``bert:<path>`` | ``uniter:<path>``.
    ``region_feat_dim`` (D) and ``num_classes`` (C) size the region side (unused by SOHO).
    ``vocab_size`` overrides the family's (the UNITER release needs 28996, bert-base-cased).
    ``overrides``: dotted config keys, e.g. ``{"transformer.hidden_dropout": 0.0,
    "visual.dictionary_momentum": 0.5}``; an unknown key is an error naming it."""
    config = get_family(family)
    changes = dict(overrides or {})
    if vocab_size is not None:
        changes["transformer.vocab_size"] = vocab_size
    if changes:
        config = config.replace(changes)
    tasks = tuple(dict.fromkeys(tasks))
    if not tasks:
        raise ValueError("create_model needs at least one task (e.g. tasks=['itm'])")
    model = VLPModel(config, tasks, feat_dim=region_feat_dim, num_classes=num_classes)
    report = initialize(model, init)
    log.info("%s (%s): %.1fM parameters; %s", family, ", ".join(tasks),
             model.num_parameters() / 1e6, report.summary())
    return ModelBundle(model, preprocess_spec(config, tasks, region_feat_dim, num_classes),
                       report)
