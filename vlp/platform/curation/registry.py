"""The curation filters by name, in the order they run (ImageBERT §3's order: images, then
text cleaning and rules, then the semantic score, then aggregation).

A filter has a ``name``, a one-line ``summary``, ``active(cfg, ctx)`` and
``__call__(pairs, alive, cfg, ctx)`` returning a boolean mask of the alive pairs it removes;
a pair is charged to the first filter that removes it. Adding a filter is one entry here and
its own file.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vlp.platform.curation.aggregate import BestTextsPerImage
from vlp.platform.curation.caption_clean import CaptionCleaner
from vlp.platform.curation.caption_length import CaptionLengthFilter
from vlp.platform.curation.image_size import ImageSizeFilter
from vlp.platform.curation.itm_filter import ItmFilter
from vlp.platform.curation.text_frequency import TextFrequencyFilter
from vlp.platform.curation.vocabulary import VocabularyFilter

FILTERS = {f.name: f for f in (ImageSizeFilter(), CaptionCleaner(), CaptionLengthFilter(),
                               VocabularyFilter(), TextFrequencyFilter(), ItmFilter(),
                               BestTextsPerImage())}


@dataclass(frozen=True)
class CurationContext:
    tokenizer: Any = None     # vlp.datasets.stream.text_tokenizer.TextTokenizer (vocabulary filter)
    scorer: Any = None        # vlp.platform.curation.itm_scorer.ItmScorer, or None


def check_filter_names(names) -> list[str]:
    unknown = [n for n in names if n not in FILTERS]
    if unknown:
        raise ValueError(f"unknown curation filter(s) {unknown}; known: {', '.join(FILTERS)}")
    return list(names)
