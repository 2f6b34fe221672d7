"""``CurationConfig``: the thresholds of every curation filter, validated on construction.

Defaults follow ImageBERT §3 where the paper gives a number and are conservative where it
does not. The image-size floor is off by default: feature imports may store a nominal canvas
instead of the real size (``uniter-npz --nominal-size``), and the synthetic world renders
96-pixel scenes; set ``min_side=300`` (ImageBERT's) for web images with real sizes.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass


class CurationConfigError(ValueError):
    """A threshold out of range; the message names the option."""


@dataclass(frozen=True)
class CurationConfig:
    # images (ImageBERT: width and height both above 300 pixels)
    min_side: int = 0                   # 0 = off
    max_aspect_ratio: float = 4.0       # longer / shorter side; 0 = off (banners, strips)
    # caption length, in whitespace words after cleaning
    min_words: int = 2
    max_words: int = 40
    # out-of-vocabulary: a word is OOV when it is [UNK] or splits into this many word pieces
    oov_min_pieces: int = 4
    max_oov_ratio: float = 0.3          # drop captions whose OOV words exceed this share
    # aggregation (ImageBERT: "if too many images have the same description ... drop")
    max_images_per_text: int = 5        # 0 = off
    max_texts_per_image: int = 1        # keep the best scored texts of one picture; 0 = off
    # semantic filter: P(match) of the ITM head of a vlp model (needs a checkpoint)
    min_itm_score: float | None = None
    itm_batch_size: int = 64

    def __post_init__(self):
        problems = list(self._problems())
        if problems:
            raise CurationConfigError("; ".join(problems))

    def _problems(self):
        for name in ("min_side", "min_words", "max_words", "max_images_per_text",
                     "max_texts_per_image"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 0:
                yield f"{name}: expected an integer ≥ 0, got {v!r}"
        if self.max_words and self.max_words < self.min_words:
            yield f"max_words {self.max_words} < min_words {self.min_words}"
        if not isinstance(self.oov_min_pieces, int) or self.oov_min_pieces < 2:
            yield f"oov_min_pieces: expected an integer ≥ 2, got {self.oov_min_pieces!r}"
        if not _finite(self.max_aspect_ratio) or (self.max_aspect_ratio and
                                                   self.max_aspect_ratio < 1):
            yield f"max_aspect_ratio: expected 0 (off) or ≥ 1, got {self.max_aspect_ratio!r}"
        if not _finite(self.max_oov_ratio) or not 0 <= self.max_oov_ratio <= 1:
            yield f"max_oov_ratio: expected a share in [0, 1], got {self.max_oov_ratio!r}"
        if self.min_itm_score is not None and (not _finite(self.min_itm_score)
                                               or not 0 <= self.min_itm_score <= 1):
            yield f"min_itm_score: expected a probability in [0, 1], got {self.min_itm_score!r}"
        if not isinstance(self.itm_batch_size, int) or self.itm_batch_size < 1:
            yield f"itm_batch_size: expected an integer ≥ 1, got {self.itm_batch_size!r}"

    def to_dict(self) -> dict:
        return asdict(self)


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
