"""Token types per text segment of a pretraining caption (UNITER's VCR second stage).

UNITER's second-stage pretraining on VCR reads "question [SEP] answer [SEP] rationale" and
gives each part its own token type (question 0, answer 2, rationale 3; the image keeps 1).
The caption stores the segments joined by [SEP]; a [SEP] takes the type of the segment it
opens, [CLS] the first segment's and the closing [SEP] the last one's, as in the reference's
VCR pretraining data. Captions with fewer segments use the first types only; a caption with
more segments than types gives the extra ones the last type.
"""

from __future__ import annotations

import numpy as np


def segment_type_ids(input_ids: np.ndarray, text_mask: np.ndarray, sep_id: int,
                     types: tuple[int, ...]) -> np.ndarray:
    """[B, T] long token types of ``[CLS] seg0 [SEP] seg1 [SEP] … [SEP]`` rows (unmasked ids:
    call before MLM can replace a [SEP])."""
    real = text_mask == 1
    sep = (input_ids == sep_id) & real
    last = real.sum(1) - 1                                 # the closing [SEP]
    rows = np.arange(len(input_ids))
    sep[rows, np.maximum(last, 0)] = False
    segment = np.minimum(np.cumsum(sep, 1), len(types) - 1)
    segment[rows, np.maximum(last, 0)] = np.minimum(sep.sum(1), len(types) - 1)
    out = np.asarray(types, np.int64)[segment]
    return np.where(real, out, 0)
