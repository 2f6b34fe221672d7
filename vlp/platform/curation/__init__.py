"""Curation of web image–text pairs (ImageBERT §3, "weak-supervised data collection"):
image size, caption cleaning, length and out-of-vocabulary rules, one text on too many
images, the ITM score of a vlp model, and one picture with several texts. One file per
filter, registered by name in ``registry.py``; ``curate.py`` runs them over a source and
writes the curated shards and a report. ``vlp data curate`` is the command."""

from vlp.platform.curation.curation_config import CurationConfig, CurationConfigError
from vlp.platform.curation.curate import CurationReport, CurationResult, curate_source, run_filters
from vlp.platform.curation.pairs import PairTable, load_pairs
from vlp.platform.curation.registry import FILTERS, CurationContext

__all__ = ["CurationConfig", "CurationConfigError", "CurationReport", "CurationResult",
           "curate_source", "run_filters", "PairTable", "load_pairs", "FILTERS",
           "CurationContext"]
