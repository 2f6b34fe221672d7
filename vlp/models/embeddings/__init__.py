"""Per-family embedders, registered by the ``kind`` of a family's visual config."""

from __future__ import annotations

from torch import nn

from .imagebert import ImageBertEmbedder
from .soho import SohoEmbedder
from .uniter import UniterEmbedder
from .vlbert import VLBertEmbedder

EMBEDDERS: dict[str, type[nn.Module]] = {
    "uniter": UniterEmbedder,
    "imagebert": ImageBertEmbedder,
    "vlbert": VLBertEmbedder,
    "soho": SohoEmbedder,
}
