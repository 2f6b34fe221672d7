"""Caption cleaning (ImageBERT §3, "heuristic rules to filter out bad spans"): alt-text and
surrounding text carry HTML entities and tags, links and layout whitespace that are no part
of a description. Cleaning rewrites the text; a caption with nothing left is removed."""

from __future__ import annotations

import html
import re
import unicodedata

import numpy as np

from vlp.platform.curation.curation_config import CurationConfig
from vlp.platform.curation.pairs import PairTable

_TAG = re.compile(r"<[^<>]*>")
_URL = re.compile(r"(?:https?://|ftp://|www\.)\S+", re.IGNORECASE)
_EMAIL = re.compile(r"\S+@\S+\.[A-Za-z]{2,}")
_SPACE = re.compile(r"\s+")


def clean_caption(text: str) -> str:
    # entities first: "&lt;b&gt;" is a tag once unescaped, "&amp;amp;" needs two rounds
    text = html.unescape(html.unescape(text))
    text = _TAG.sub(" ", text)
    text = _URL.sub(" ", text)
    text = _EMAIL.sub(" ", text)
    # control and format characters (zero-width spaces, BOMs) are invisible word breakers
    text = "".join(" " if unicodedata.category(c) in ("Cc", "Cf") else c for c in text)
    return _SPACE.sub(" ", text).strip()


class CaptionCleaner:
    name = "clean"
    summary = "HTML entities and tags, URLs, e-mail addresses, control characters and " \
              "extra whitespace removed; captions left empty are dropped"

    def active(self, cfg: CurationConfig, ctx) -> bool:
        return True

    def __call__(self, pairs: PairTable, alive: np.ndarray, cfg: CurationConfig, ctx
                 ) -> np.ndarray:
        empty = np.zeros(pairs.num_pairs, bool)
        for p in np.flatnonzero(alive):
            pairs.text[p] = clean_caption(pairs.text[p])
            empty[p] = not pairs.text[p]
        return empty
