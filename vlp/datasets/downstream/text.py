"""Task texts → word pieces once per table, then padded ``[CLS] a [SEP] (b [SEP] ...)`` rows.

Texts are tokenized with the pipeline's tokenizer into one flat int32 array plus offsets
(:class:`TokenizedTexts`), the layout Arrow uses, so a table of questions costs two arrays.
Multi-segment rows (VCR: question, answer, rationale) get one token type per segment.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vlp.contract import batch_spec as K
from vlp.datasets.storage.arrow_views import ranges
from vlp.datasets.stream.text_tokenizer import TextTokenizer


@dataclass(frozen=True)
class TokenizedTexts:
    tokens: np.ndarray      # int32 [all word pieces]
    start: np.ndarray       # int64 [n + 1]

    @classmethod
    def encode(cls, tok: TextTokenizer, texts: list[str], max_len: int) -> "TokenizedTexts":
        """Word pieces of each text, truncated to ``max_len`` (UNITER drops over-long
        pretraining captions; a benchmark keeps every question, so it truncates)."""
        flat, lengths = tok.encode(list(texts))
        starts = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        kept = np.minimum(lengths, max_len)
        take = np.repeat(starts[:-1], kept) + ranges(kept)
        return cls(flat[take].astype(np.int32),
                   np.concatenate([[0], np.cumsum(kept)]).astype(np.int64))

    def __len__(self) -> int:
        return len(self.start) - 1

    def lengths(self, idx: np.ndarray) -> np.ndarray:
        idx = np.asarray(idx, np.int64)
        return self.start[idx + 1] - self.start[idx]


def text_batch(tok: TextTokenizer, segments: list[tuple]) -> dict[str, np.ndarray]:
    """Padded text arrays for B rows built from segments ``(texts, index [B], type)`` or
    ``(texts, index [B], type, closes)``: ``[CLS] s1 [SEP] s2 [SEP] ...``, where a segment
    with ``closes`` False runs straight into the next one (no [SEP]: VL-BERT's QA→R writes
    question and answer as one sentence A); ``text_type_ids`` is added when a segment has a
    type other than 0 ([CLS] and each [SEP] take the type of the segment they close)."""
    closes = [True if len(seg) < 4 else bool(seg[3]) for seg in segments]
    segments = [seg[:3] for seg in segments]
    B = len(segments[0][1])
    lens = [texts.lengths(idx) for texts, idx, _ in segments]
    total = 1 + sum(n + int(c) for n, c in zip(lens, closes))   # [CLS] + segments + [SEP]s
    T = int(total.max())
    ids = np.full((B, T), tok.pad_id, np.int64)
    types = np.zeros((B, T), np.int64)
    ids[:, 0] = tok.cls_id
    at = np.ones(B, np.int64)                                 # next free position per row
    rows = np.arange(B)
    for (texts, idx, kind), n, close in zip(segments, lens, closes):
        idx = np.asarray(idx, np.int64)
        ex, pos = np.repeat(rows, n), ranges(n)
        ids[ex, np.repeat(at, n) + pos] = texts.tokens[np.repeat(texts.start[idx], n) + pos]
        types[ex, np.repeat(at, n) + pos] = kind
        at = at + n
        if not close:
            continue
        ids[rows, at] = tok.sep_id
        types[rows, at] = kind
        at = at + 1
    out = {K.INPUT_IDS: ids,
           K.TEXT_MASK: (np.arange(T)[None, :] < total[:, None]).astype(np.int64)}
    if any(kind for _, _, kind in segments):
        out[K.TEXT_TYPE_IDS] = types * out[K.TEXT_MASK]
    return out
