"""``CurationConfig``: the thresholds of every curation filter, validated on construction.

Defaults follow ImageBERT §3 where the paper gives a number and are conservative where it
does not. The image-size floor is off by default: feature imports may store a nominal canvas
instead of the real size (``uniter-npz --nominal-size``), and the synthetic world renders
96-pixel scenes; set ``min_side=300`` (ImageBERT's) for web images with real sizes.
"""

from __future__ import annotations

from pydantic import Field

from vlp.contract.config_errors import ProblemsError
from vlp.contract.config_loader import ConfigModel


class CurationConfigError(ProblemsError):
    """A threshold out of range; the message names the option."""

    title = "invalid curation config"


class CurationConfig(ConfigModel, frozen=True):
    error = CurationConfigError
    validate_on_init = True
    # images (ImageBERT: width and height both above 300 pixels)
    min_side: int = Field(0, ge=0)      # 0 = off
    max_aspect_ratio: float = 4.0       # longer / shorter side; 0 = off (banners, strips)
    # caption length, in whitespace words after cleaning
    min_words: int = Field(2, ge=0)
    max_words: int = Field(40, ge=0)
    # out-of-vocabulary: a word is OOV when it is [UNK] or splits into this many word pieces
    oov_min_pieces: int = Field(4, ge=2)
    max_oov_ratio: float = Field(0.3, ge=0, le=1)   # drop captions whose OOV words exceed this
    # aggregation (ImageBERT: "if too many images have the same description ... drop")
    max_images_per_text: int = Field(5, ge=0)   # 0 = off
    max_texts_per_image: int = Field(1, ge=0)   # keep the best scored texts of one picture;
                                                # 0 = off
    # semantic filter: P(match) of the ITM head of a vlp model (needs a checkpoint)
    min_itm_score: float | None = Field(None, ge=0, le=1)
    itm_batch_size: int = Field(64, ge=1)

    def validate(self):
        if self.max_words and self.max_words < self.min_words:
            yield "max_words", f"max_words {self.max_words} < min_words {self.min_words}"
        if self.max_aspect_ratio and self.max_aspect_ratio < 1:
            yield "max_aspect_ratio", f"expected 0 (off) or ≥ 1, got {self.max_aspect_ratio!r}"

    def to_dict(self) -> dict:
        return self.model_dump()
