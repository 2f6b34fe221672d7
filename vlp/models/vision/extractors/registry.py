"""Extractors by name: name → builder ``(weights, settings, size) -> Extractor``.

Builders are named as ``module:function`` strings and imported on first use, so listing the
names (the CLI's ``--help``, ``--check``) imports no model code, and an extractor's module is
loaded only inside the actors that run it.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable

from vlp.models.vision.extractors.base import Extractor, ExtractSettings


@dataclass(frozen=True)
class ExtractorEntry:
    name: str
    builder: str          # "module:function" taking (weights, settings, size=...)
    size: str             # the size the builder is asked for
    summary: str
    takes_boxes: bool = False   # featurises given boxes (``vlp data extract --boxes``)

    def build(self, weights: str | None, settings: ExtractSettings) -> Extractor:
        module, func = self.builder.split(":")
        fn: Callable[..., Extractor] = getattr(importlib.import_module(module), func)
        return fn(weights, settings, size=self.size)


_BUTD = "vlp.models.vision.detection.butd:build_butd"
_GRID = "vlp.models.vision.extractors.grid:build_grid"
_PIXELS = "vlp.models.vision.extractors.pixels:build_pixels"

EXTRACTORS: dict[str, ExtractorEntry] = {e.name: e for e in [
    ExtractorEntry("butd-r101-c4", _BUTD, "base",
                   "Faster R-CNN, ResNet-101 C4, 1601 VG classes (BUTD): regions, soft labels",
                   takes_boxes=True),
    ExtractorEntry("butd-tiny", _BUTD, "tiny", "a tiny random BUTD detector (tests)",
                   takes_boxes=True),
    ExtractorEntry("grid-r50", _GRID, "r50", "ResNet-50 C5 map pooled to a G×G grid "
                                             "(\"In Defense of Grid Features\")"),
    ExtractorEntry("grid-r101", _GRID, "r101", "ResNet-101 C5 map pooled to a G×G grid"),
    ExtractorEntry("grid-tiny", _GRID, "tiny", "a tiny ResNet grid extractor (tests)"),
    ExtractorEntry("pixels", _PIXELS, "base", "the resized, encoded image for end-to-end "
                                              "families (SOHO); no model"),
]}


def extractor_entry(name: str) -> ExtractorEntry:
    try:
        return EXTRACTORS[name]
    except KeyError:
        raise ValueError(f"--model {name!r}: unknown extractor; known: "
                         f"{', '.join(EXTRACTORS)}") from None


def build_extractor(name: str, weights: str | None, settings: ExtractSettings) -> Extractor:
    """The named extractor with ``weights`` (a local file, or None for random init)."""
    return extractor_entry(name).build(weights, settings)
