"""Random batches that follow the batch contract, for tests, benchmarks and smoke runs.

The content is random (a fixed batch is learnable by memorising, which is what overfitting
tests need) but the masking is the data pipeline's own: the unmasked arrays go through
``vlp.tasks.apply_masking`` (conditional mode) and VL-BERT's whole-image feature through
``whole_image_feature``, the code ``vlp.datasets.batching.task_batch`` runs for real data, so
a change to a task's masking policy changes these batches too (and the stored reference
curves built from them). ITM negatives are drawn here (half the pairs, at random): the
pipeline's donor choice needs image blocks. Real data comes from ``vlp.datasets``.
"""

from __future__ import annotations

import numpy as np
import torch

from vlp.contract import batch_spec as bs
from vlp.datasets.batching.task_batch import to_torch, whole_image_feature
from vlp.models.factory import PreprocessSpec
from vlp.tasks import MaskContext, apply_masking, get_task
from vlp.tasks.masking_visual import SOFT_LABELS

CLS, SEP, MASK, FIRST_WORD = 101, 102, 103, 1000  # BERT WordPiece ids (cased and uncased)
MASK_PROB = 0.15
# the example world's detector class names (mlm-obj's targets): one per caption but the last,
# whose caption names none (mlm-obj falls back to BERT's 15% there)
OBJECT_IDS = np.arange(FIRST_WORD, FIRST_WORD + 8)


def mask_context(vocab_size: int) -> MaskContext:
    return MaskContext(MASK_PROB, MASK, CLS, SEP, np.arange(FIRST_WORD, vocab_size), OBJECT_IDS)


def _boxes(n: tuple[int, int], g: torch.Generator) -> torch.Tensor:
    corners = torch.rand(*n, 2, 2, generator=g).sort(dim=-2).values  # [..., (min, max), (x, y)]
    x1, y1 = corners[..., 0, 0], corners[..., 0, 1]
    x2, y2 = corners[..., 1, 0] + 1e-3, corners[..., 1, 1] + 1e-3
    return torch.stack([x1, y1, x2.clamp(max=1), y2.clamp(max=1)], dim=-1)


def _location(boxes: torch.Tensor, kind: str) -> torch.Tensor:
    x1, y1, x2, y2 = boxes.unbind(-1)
    w, h = x2 - x1, y2 - y1
    return {"uniter7": lambda: torch.stack([x1, y1, x2, y2, w, h, w * h], -1),
            "imagebert5": lambda: torch.stack([x1, y1, x2, y2, w * h], -1),
            "box4": lambda: boxes}[kind]()


def _text(b: int, t: int, vocab_size: int, full_length: bool, g: torch.Generator
          ) -> tuple[torch.Tensor, torch.Tensor]:
    """[CLS] words [SEP] [PAD]…; one word of every caption but the last names an object."""
    lengths = (torch.full((b,), t) if full_length
               else torch.randint(max(3, t // 2), t + 1, (b,), generator=g))
    text_mask = torch.arange(t)[None] < lengths[:, None]
    first_plain = FIRST_WORD + len(OBJECT_IDS)
    ids = torch.randint(first_plain, max(vocab_size, first_plain + 1), (b, t), generator=g)
    rows = torch.arange(b - 1) if b > 1 else torch.arange(0)
    at = 1 + (torch.rand(len(rows), generator=g) * (lengths[rows] - 2)).long()
    ids[rows, at] = torch.from_numpy(OBJECT_IDS)[
        torch.randint(len(OBJECT_IDS), (len(rows),), generator=g)]
    ids[:, 0] = CLS
    ids[torch.arange(b), lengths - 1] = SEP
    ids[~text_mask] = 0
    return ids, text_mask


def example_batch(spec: PreprocessSpec, task: str, batch_size: int = 4, text_len: int = 12,
                  num_regions: int = 10, image_size: tuple[int, int] | None = None,
                  seed: int = 0, full_length: bool = False) -> dict[str, torch.Tensor]:
    """One batch for ``task``; ``full_length`` makes every text and image full (benchmarks)."""
    g = torch.Generator().manual_seed(seed)
    policy = get_task(task)   # its masked modality and inputs, from the task registry
    b, t = batch_size, text_len
    ids, text_mask = _text(b, t, spec.vocab_size, full_length, g)
    positive = torch.ones(b, dtype=torch.bool)
    batch: dict[str, np.ndarray] = {}
    if policy.itm_negatives:
        labels = (torch.arange(b) % 2 == 0).long()[torch.randperm(b, generator=g)]
        batch[bs.ITM_LABELS] = labels.numpy()
        positive = labels.bool()
    batch[bs.POSITIVE] = positive.numpy()
    batch[bs.INPUT_IDS], batch[bs.TEXT_MASK] = ids.numpy(), text_mask.long().numpy()

    if spec.input_kind == "regions":
        n, d, c = num_regions, spec.region_feat_dim, spec.num_classes
        counts = (torch.full((b,), n) if full_length
                  else torch.randint(max(2, n // 2), n + 1, (b,), generator=g))
        region_mask = torch.arange(n)[None] < counts[:, None]
        if policy.text_only:   # a text corpus batch: no image (batching.text_corpus)
            region_mask = region_mask[:, :0]
        feats = torch.relu(torch.randn(*region_mask.shape, d, generator=g)) * region_mask[..., None]
        loc = _location(_boxes(tuple(region_mask.shape), g), spec.location_kind)
        batch[bs.REGION_FEATS] = feats.numpy()
        batch[bs.REGION_LOC] = (loc * region_mask[..., None]).numpy()
        batch[bs.REGION_MASK] = region_mask.long().numpy()
        if policy.needs_soft_labels:   # the detector's class distributions
            soft = torch.softmax(3 * torch.randn(*region_mask.shape, c, generator=g), -1)
            batch[SOFT_LABELS] = soft.numpy()
        units = t + region_mask.shape[1]
    else:
        images = max(1, (b + 1) // 2)  # SOHO: each image serves two texts
        h, w = image_size or (spec.image_min_side, spec.image_min_side)
        pixels = torch.randn(images, 3, h, w, generator=g)
        pixel_mask = torch.ones(images, h, w, dtype=torch.long)
        if images > 1 and not full_length:
            pixel_mask[-1, :, w * 3 // 4:] = 0  # one padded image
            pixels[-1, :, :, w * 3 // 4:] = 0
        batch[bs.PIXELS], batch[bs.PIXEL_MASK] = pixels.numpy(), pixel_mask.numpy()
        batch[bs.IMAGE_INDEX] = (torch.arange(b) % images).numpy()
        units = t

    rng = np.random.default_rng(seed)
    if spec.input_kind == "regions" and (spec.needs_image_feat or policy.image_feat):
        # before masking, as the pipeline does (the unmasked image's feature)
        batch[bs.IMAGE_FEAT] = (np.zeros((b, spec.region_feat_dim), np.float32)
                                if policy.text_only else whole_image_feature(batch))
    apply_masking(task, batch, rng, mask_context(spec.vocab_size), "conditional",
                  spec.input_kind)
    batch[bs.NUM_EXAMPLES] = np.array(b, np.int64)
    batch[bs.INPUT_UNITS] = np.array(b * units if not policy.text_only else b * t, np.int64)
    return to_torch(batch)
