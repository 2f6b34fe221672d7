"""One batch for one task: ITM negatives, segment types, the task's masking, the whole-image
feature, tensors. Shared by the worker's ``PretrainBatches`` and the fixed-size Ray Data
collate (``vlp.datasets.stream.pipeline.TaskCollateFn``)."""

from __future__ import annotations

from collections import Counter
from typing import Mapping

import numpy as np
import torch

from vlp.contract import batch_spec as K
from vlp.contract.batch_indices import add_model_indices
from vlp.datasets.batching.collate import (HAS_WHOLE, IMAGE_KEYS, TEXT_KEYS, WHOLE_FEAT,
                                           ExampleRefs, collate_examples, example_lengths)
from vlp.datasets.batching.fixed_shapes import ShapeSet, pad_to_shape
from vlp.datasets.batching.image_block import ImageBlock
from vlp.datasets.batching.itm_negatives import apply_donors, choose_donors
from vlp.datasets.batching.segment_types import segment_type_ids
from vlp.datasets.batching.window_collate import resolve_regions, swap_negatives
from vlp.datasets.stream.data_plan import DataPlan
from vlp.datasets.stream.text_tokenizer import TextTokenizer
from vlp.tasks import MaskContext, apply_group_masking, get_task

EXAMPLE_IMAGE_KEY = "example_image_key"   # optional extras (with_ids): long [B]
EXAMPLE_TEXT_KEY = "example_text_key"


def mask_context(plan: DataPlan, tok: TextTokenizer) -> MaskContext:
    return MaskContext(plan.config.mask_prob, tok.mask_id, tok.cls_id, tok.sep_id,
                       tok.random_ids, object_word_ids(tok, plan.object_words))


def object_word_ids(tok: TextTokenizer, words: tuple[str, ...]) -> np.ndarray:
    """Ids of the object words that are one word piece (a name split into pieces has no
    single token to mask and predict)."""
    if not words:
        return np.zeros(0, np.int64)
    flat, lengths = tok.encode(list(words))   # the tokenizer normalises case itself
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    return np.unique(flat[starts[lengths == 1]].astype(np.int64))


def task_batch(plan: DataPlan, tok: TextTokenizer, ctx: MaskContext,
               blocks: Mapping[int, ImageBlock], refs: ExampleRefs,
               task: str | tuple[str, ...], rng: np.random.Generator,
               stats: Counter | None = None, *, with_ids: bool = False,
               collated: dict | None = None, shapes: ShapeSet | None = None
               ) -> dict[str, torch.Tensor]:
    """The batch of ``refs`` for ``task`` — or for a forward group of tasks (one batch, each
    modality masked once: ``apply_group_masking``): ITM negatives, masking, tensors.
    ``collated``: the refs' unmasked arrays from ``collate_window`` (region input; written
    to), else the refs are collated here. Both give the same batch for the same generator.
    ``shapes``: pad the batch to its fixed shape (``fixed_shapes``; region input)."""
    cfg = plan.config
    tasks = (task,) if isinstance(task, str) else tuple(task)
    policies = [get_task(t) for t in tasks]
    need_soft = any(p.needs_soft_labels for p in policies) and cfg.visual == "regions"
    itm = next((p for p in policies if p.itm_negatives), None)
    donors = None
    if itm is not None and cfg.visual == "regions":
        if collated is not None:
            keys = collated[TEXT_KEYS]
            text_len, regions = collated[K.TEXT_MASK].sum(1), collated[K.REGION_MASK].sum(1)
        else:
            keys, text_len, regions = example_lengths(blocks, refs)
        donors = choose_donors(keys, text_len, regions, cfg.itm_neg_prob, rng,
                               text_only=itm.negatives_swap == "text")
        if stats is not None:
            stats["itm_negatives"] += int(donors.negative.sum())
            stats["itm_no_donor"] += donors.no_donor
            stats["itm_length_mismatch"] += donors.length_mismatch
    if collated is not None:
        batch = swap_negatives(collated, donors) if donors is not None else dict(collated)
        resolve_regions(batch, need_soft)
    else:
        if donors is not None:
            refs = apply_donors(refs, donors)
        batch = collate_examples(blocks, refs, tok, visual=cfg.visual,
                                 feature_dim=plan.feature_dim, loc_dim=plan.loc_dim,
                                 num_classes=plan.num_classes, need_soft=need_soft,
                                 pixel_cfg=cfg.pixels)
    if itm is not None:
        batch[K.ITM_LABELS] = batch[K.POSITIVE].astype(np.int64)
    if cfg.text_segment_types:   # from the ids before MLM replaces any
        batch[K.TEXT_TYPE_IDS] = segment_type_ids(batch[K.INPUT_IDS], batch[K.TEXT_MASK],
                                                  tok.sep_id, cfg.text_segment_types)
    # VL-BERT's whole-image feature, from the image as it is (before any RoI is masked): the
    # text tokens see the same visual feature whatever the masking (whole_image_feature)
    if (cfg.image_feat or any(p.image_feat for p in policies)) and cfg.visual == "regions":
        batch[K.IMAGE_FEAT] = whole_image_feature(batch)
    apply_group_masking(tasks, batch, rng, ctx, cfg.masking, cfg.visual)
    if with_ids:   # image_key(image_id) of each example's visual side and of its caption
        batch[EXAMPLE_IMAGE_KEY] = batch[IMAGE_KEYS]
        batch[EXAMPLE_TEXT_KEY] = batch[TEXT_KEYS]
    add_model_indices(batch)   # lengths and loss positions as host data: no device reads
    if shapes is not None and cfg.visual == "regions":
        pad_to_shape(batch, shapes, stats)
    return to_torch(batch)


def whole_image_feature(batch: dict[str, np.ndarray]) -> np.ndarray:
    """VL-BERT's whole-image feature (§3.2: the detector's feature of an RoI covering the whole
    image), the same in every example of an image, masked RoI or not: the stored feature
    where the shard has one, else the mean of the image's real regions. Call it before any
    masking (the pipeline does): masking zeroes the masked RoIs' input rows in place.

    The paper (§3.3, Task #3) zeroes the masked RoI's pixels before running the detector, so
    its text tokens see a whole-image feature without the masked object. Region input carries
    features computed once from the intact image, so this cannot be done here: vlp's text
    tokens see the intact image's feature (the masked RoI's own row is zeroed and replaced by
    the learned embedding in the region stream, so the RoI itself does not leak; its content
    reaches the text tokens only through the one whole-image vector). Recomputing it per
    masking would need the detector in the batch path (pixels); vlp does not do that."""
    use = (batch[K.REGION_MASK] == 1).astype(np.float32)[..., None]
    mean = (batch[K.REGION_FEATS] * use).sum(1) / np.maximum(use.sum(1), 1.0)
    if HAS_WHOLE not in batch:
        return mean
    return np.where(batch[HAS_WHOLE][:, None], batch[WHOLE_FEAT].astype(np.float32), mean)


def to_torch(batch: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    out = {}
    for k, v in batch.items():
        if k.startswith("_"):
            continue   # internal (soft labels when not a target, identity keys)
        out[k] = torch.from_numpy(np.ascontiguousarray(v)) if v.ndim else torch.tensor(v.item())
    return out
