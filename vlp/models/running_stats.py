"""Running statistics that a training forward updates: SOHO's visual dictionary (the moving
average of its entries) and BatchNorm's running mean and variance.

Under the summed objective the model runs once per task on the same example set, so a
plain loop would move these statistics once per task: three dictionary updates per SOHO
micro-batch from the same images, where the paper forwards each image once per batch.
``statistics_frozen`` keeps them still for the forwards after the first; the gradients are
unchanged (BatchNorm still normalises with the batch's statistics, the dictionary still
quantises with its current entries).

``images_encoded_once`` goes further for pixel input: the other tasks reuse the first
forward's image encoding (SOHO's ResNet and dictionary output) instead of recomputing it.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from torch import nn

from vlp.models.embeddings.soho import SohoEmbedder
from vlp.models.vision.visual_dictionary import VisualDictionary


@contextmanager
def statistics_frozen(model: nn.Module) -> Iterator[None]:
    dictionaries = [m for m in model.modules() if isinstance(m, VisualDictionary)]
    norms = [m for m in model.modules()
             if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats]
    saved = [(m, m.momentum, None if m.num_batches_tracked is None
              else m.num_batches_tracked.clone()) for m in norms]
    for d in dictionaries:
        d.updates = False
    for m in norms:
        m.momentum = 0.0      # running ← (1 − 0) · running + 0 · batch: unchanged
    try:
        yield
    finally:
        for d in dictionaries:
            d.updates = True
        for m, momentum, tracked in saved:
            m.momentum = momentum
            if tracked is not None:
                m.num_batches_tracked.copy_(tracked)


@contextmanager
def images_encoded_once(model: nn.Module) -> Iterator[None]:
    """Within: forwards of the same images (one example set's batch per task) encode them
    once; the cache is dropped on exit, so nothing outlives the micro-batch."""
    embedders = [m for m in model.modules() if isinstance(m, SohoEmbedder)]
    for m in embedders:
        m.shared_images = {}
    try:
        yield
    finally:
        for m in embedders:
            m.shared_images = None
