"""What the downstream adapters need to know about the model's input side.

It is derived from the model's :class:`~vlp.models.PreprocessSpec` (:func:`data_config_for`)
so that finetuning feeds a checkpoint exactly what it was pretrained on: the same location
encoding, feature width and region selection.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from vlp.contract.config_loader import ConfigModel
from vlp.datasets.stream.data_config import PixelConfig, RegionConfig, family_regions

# PreprocessSpec.location_kind → the pipeline's LOCATION_FEATURES key
LOCATION_OF_KIND = {"uniter7": "uniter", "imagebert5": "imagebert", "box4": "vlbert"}


class DownstreamDataConfig(ConfigModel, frozen=True):
    world: str                                 # folder with manifest.json (vlp world)
    visual: Literal["regions", "pixels"] = "regions"   # pixels: SOHO
    location: str = "uniter"                   # a key of stream.location.LOCATION_FEATURES
    feature_dim: int = Field(0, ge=0)          # D the model expects (0: take the shards')
    tokenizer_path: str | None = None          # None = the packaged uncased vocab
    max_text_len: int = Field(60, ge=1)        # word pieces per text segment (UNITER: 60)
    regions: RegionConfig = Field(default_factory=RegionConfig)
    pixels: PixelConfig = Field(default_factory=PixelConfig)
    image_feat: bool = False                   # VL-BERT's whole-image feature
    image_source: str = "downstream"           # manifest source of the detected regions
    gt_sidecar: str = "gt_box_features"        # manifest sidecar: folder of image shards with
                                               #   features of the annotated (gt) boxes


def data_config_for(spec, world: str, **overrides) -> DownstreamDataConfig:
    """The data side for a model's ``PreprocessSpec`` (``create_model(...).preprocess``)."""
    visual = spec.input_kind
    kw = dict(world=str(world), visual=visual, tokenizer_path=spec.vocab_file,
              image_feat=spec.needs_image_feat,
              max_text_len=min(60, spec.max_text_positions - 4))
    if visual == "regions":
        # the family's paper's region selection, as its pretraining saw them
        kw.update(location=LOCATION_OF_KIND[spec.location_kind],
                  feature_dim=int(spec.region_feat_dim or 0),
                  regions=family_regions(spec.family))
    else:
        kw["pixels"] = PixelConfig(mean=tuple(spec.pixel_mean), std=tuple(spec.pixel_std))
    kw.update(overrides)
    return DownstreamDataConfig(**kw)
