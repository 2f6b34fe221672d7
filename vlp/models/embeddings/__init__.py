"""Per-family embedders, registered by the ``kind`` of a family's visual config."""

from __future__ import annotations

from torch import nn

from vlp.models.embeddings.imagebert import ImageBertEmbedder
from vlp.models.embeddings.soho import SohoEmbedder
from vlp.models.embeddings.uniter import UniterEmbedder
from vlp.models.embeddings.vlbert import VLBertEmbedder

EMBEDDERS: dict[str, type[nn.Module]] = {
    "uniter": UniterEmbedder,
    "imagebert": ImageBertEmbedder,
    "vlbert": VLBertEmbedder,
    "soho": SohoEmbedder,
}
