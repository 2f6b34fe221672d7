"""Random batches that follow the batch contract, for tests, benchmarks and smoke runs.

They have the keys, dtypes and masking structure the pipeline produces for each task (BERT
masking for MLM, 15% of regions masked with at least one per image, MOC's 90/10 zero/keep,
ITM negatives, SOHO images shared by two texts) but random content: a fixed batch is
learnable by memorising, which is what overfitting tests need. Real data comes from
``vlp.datasets``.
"""

from __future__ import annotations

import torch

from vlp.contract import batch_spec as bs

from vlp.models.factory import PreprocessSpec
from vlp.tasks import get_task

CLS, SEP, MASK, FIRST_WORD = 101, 102, 103, 1000  # BERT WordPiece ids (cased and uncased)


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


def _pick(mask: torch.Tensor, p: float, g: torch.Generator) -> torch.Tensor:
    """Each True of ``mask`` with probability p, at least one per row that has any."""
    picked = (torch.rand(mask.shape, generator=g) < p) & mask
    first = torch.where(mask, torch.rand(mask.shape, generator=g), -1.0).argmax(1)
    rows = mask.any(1)
    picked[rows.nonzero()[:, 0], first[rows]] = True
    return picked


def example_batch(spec: PreprocessSpec, task: str, batch_size: int = 4, text_len: int = 12,
                  num_regions: int = 10, image_size: tuple[int, int] | None = None,
                  seed: int = 0, full_length: bool = False) -> dict[str, torch.Tensor]:
    """One batch for ``task``; ``full_length`` makes every text and image full (benchmarks)."""
    g = torch.Generator().manual_seed(seed)
    spec_of_task = get_task(task)   # its masked modality and inputs, from the task registry
    b, t = batch_size, text_len
    lengths = (torch.full((b,), t) if full_length
               else torch.randint(max(3, t // 2), t + 1, (b,), generator=g))
    text_mask = torch.arange(t)[None] < lengths[:, None]
    ids = torch.randint(FIRST_WORD, spec.vocab_size, (b, t), generator=g)
    ids[:, 0] = CLS
    ids[torch.arange(b), lengths - 1] = SEP
    ids[~text_mask] = 0
    batch: dict[str, torch.Tensor] = {}

    positive = torch.ones(b, dtype=torch.bool)
    if spec_of_task.itm_negatives:
        labels = (torch.arange(b) % 2 == 0).long()[torch.randperm(b, generator=g)]
        batch[bs.ITM_LABELS] = labels
        positive = labels.bool()
    batch[bs.POSITIVE] = positive

    if spec_of_task.modality == "text":   # example batches: any word stands for an object word
        words = text_mask.clone()
        words[:, 0] = False
        words[torch.arange(b), lengths - 1] = False
        masked = _pick(words, 0.15, g)
        batch[bs.MLM_LABELS] = torch.where(masked, ids, -100)
        draw = torch.rand(b, t, generator=g)
        random_ids = torch.randint(FIRST_WORD, spec.vocab_size, (b, t), generator=g)
        ids = torch.where(masked & (draw < 0.8), MASK, ids)
        ids = torch.where(masked & (draw >= 0.8) & (draw < 0.9), random_ids, ids)
    batch[bs.INPUT_IDS], batch[bs.TEXT_MASK] = ids, text_mask.long()

    if spec.input_kind == "regions":
        n, d, c = num_regions, spec.region_feat_dim, spec.num_classes
        counts = (torch.full((b,), n) if full_length
                  else torch.randint(max(2, n // 2), n + 1, (b,), generator=g))
        region_mask = torch.arange(n)[None] < counts[:, None]
        raw = torch.relu(torch.randn(b, n, d, generator=g)) * region_mask[..., None]
        feats = raw.clone()
        batch[bs.REGION_LOC] = _location(_boxes((b, n), g), spec.location_kind) * region_mask[..., None]
        batch[bs.REGION_MASK] = region_mask.long()
        if spec_of_task.modality == "regions":
            masked = _pick(region_mask & positive[:, None], 0.15, g)
            zeroed = masked & (torch.rand(b, n, generator=g) < 0.9) if task == "moc" else masked
            feats[zeroed] = 0.0
            soft = torch.softmax(3 * torch.randn(b, n, c, generator=g), -1)
            batch[bs.REGION_MASKED], batch[bs.REGION_ZEROED] = masked, zeroed
            batch[bs.REGION_FEAT_TARGETS] = raw
            batch[bs.REGION_SOFT_LABELS] = soft
            batch[bs.REGION_CLASS_LABELS] = torch.where(masked, soft[..., 1:].argmax(-1) + 1, -100)
            unmasked = region_mask & ~masked
        else:
            unmasked = region_mask
        batch[bs.REGION_FEATS] = feats
        if spec.needs_image_feat:  # whole image = mean of the regions left visible
            weights = unmasked[..., None].float()
            batch[bs.IMAGE_FEAT] = (raw * weights).sum(1) / weights.sum(1).clamp(min=1)
        units = t + n
    else:
        images = max(1, (b + 1) // 2)  # SOHO: each image serves two texts
        h, w = image_size or (spec.image_min_side, spec.image_min_side)
        batch[bs.PIXELS] = torch.randn(images, 3, h, w, generator=g)
        pixel_mask = torch.ones(images, h, w, dtype=torch.long)
        if images > 1 and not full_length:
            pixel_mask[-1, :, w * 3 // 4:] = 0  # one padded image
            batch[bs.PIXELS][-1, :, :, w * 3 // 4:] = 0
        batch[bs.PIXEL_MASK] = pixel_mask
        batch[bs.IMAGE_INDEX] = torch.arange(b) % images
        if spec_of_task.modality == "pixels":
            batch[bs.MVM_APPLY] = torch.ones(images, dtype=torch.bool)
        units = t
    if spec_of_task.text_only:   # a text corpus batch: no image (vlp.datasets.batching.text_corpus)
        for k in (bs.REGION_FEATS, bs.REGION_LOC, bs.REGION_MASK):
            batch[k] = batch[k][:, :0]
        if bs.IMAGE_FEAT in batch:
            batch[bs.IMAGE_FEAT] = torch.zeros_like(batch[bs.IMAGE_FEAT])
        units = t
    batch[bs.NUM_EXAMPLES] = torch.tensor(b)
    batch[bs.INPUT_UNITS] = torch.tensor(b * units)
    return batch
