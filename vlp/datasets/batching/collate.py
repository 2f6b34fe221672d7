"""Gather a batch of examples from image blocks into padded numpy arrays (no masking yet).

Examples are given by reference: the text is caption ``text_cap`` of image row ``text_row`` of
block ``text_block``; the visual side is image row ``image_row`` of ``image_block`` (the two
differ for ITM negatives). Text gets [CLS] … [SEP] and [PAD] to the batch's longest; regions
are padded to the batch's most regions; pixels to the largest image (SOHO forwards each
distinct image once: ``image_index`` points each example at its image).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Mapping

import numpy as np

from vlp.contract import batch_spec as K
from vlp.datasets.storage.arrow_views import ranges
from vlp.datasets.stream.data_config import PixelConfig
from vlp.datasets.batching.image_block import ImageBlock
from vlp.tasks.masking_visual import SOFT_LABELS
from vlp.datasets.stream.pixels import pad_images, visual_tokens
from vlp.datasets.stream.text_tokenizer import TextTokenizer

IMAGE_KEYS = "_image_keys"   # internal: int64 [B] image identity of each example's visual side
TEXT_KEYS = "_text_keys"     # internal: int64 [B] image the example's caption belongs to
WHOLE_FEAT = "_whole_feat"   # internal: fp16 [B, D] the image's whole-image RoI (VL-BERT)
HAS_WHOLE = "_has_whole"     # internal: bool [B] whether the image has one


@dataclass(frozen=True)
class ExampleRefs:
    text_block: np.ndarray
    text_row: np.ndarray
    text_cap: np.ndarray
    image_block: np.ndarray
    image_row: np.ndarray
    positive: np.ndarray

    def __len__(self) -> int:
        return len(self.text_row)

    def take(self, idx: np.ndarray) -> "ExampleRefs":
        return ExampleRefs(*(getattr(self, f)[idx] for f in _FIELDS))

    def with_(self, **kw) -> "ExampleRefs":
        return replace(self, **kw)

    @staticmethod
    def concat(parts: list["ExampleRefs"]) -> "ExampleRefs":
        return ExampleRefs(*(np.concatenate([getattr(p, f) for p in parts]) for f in _FIELDS))


_FIELDS = ("text_block", "text_row", "text_cap", "image_block", "image_row", "positive")


def caption_spans(blocks: Mapping[int, ImageBlock], refs: ExampleRefs
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per example: where its caption's word pieces start in its block, how many there are,
    and the image_key of the image the caption belongs to."""
    at, count, keys = (np.zeros(len(refs), np.int64) for _ in range(3))
    for b in np.unique(refs.text_block):
        sel = np.flatnonzero(refs.text_block == b)
        blk = blocks[b]
        g = blk.cap_start[refs.text_row[sel]] + refs.text_cap[sel]
        at[sel] = blk.tok_start[g]
        count[sel] = blk.tok_start[g + 1] - blk.tok_start[g]
        keys[sel] = blk.image_key[refs.text_row[sel]]
    return at, count, keys


def image_spans(blocks: Mapping[int, ImageBlock], refs: ExampleRefs
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per example: its image's first region row in its block, its regions, its image_key."""
    at, count, keys = (np.zeros(len(refs), np.int64) for _ in range(3))
    for b in np.unique(refs.image_block):
        sel = np.flatnonzero(refs.image_block == b)
        rows = refs.image_row[sel]
        at[sel] = blocks[b].region_start[rows]
        count[sel] = blocks[b].num_regions[rows]
        keys[sel] = blocks[b].image_key[rows]
    return at, count, keys


def example_lengths(blocks: Mapping[int, ImageBlock], refs: ExampleRefs
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per example: image_key of the caption's image, text length with [CLS]/[SEP], regions."""
    _, n_tok, keys = caption_spans(blocks, refs)
    return keys, n_tok + 2, image_spans(blocks, refs)[1]


def text_arrays(blocks: list[ImageBlock], refs: ExampleRefs, tok: TextTokenizer
                ) -> dict[str, np.ndarray]:
    B = len(refs)
    starts, lengths, keys = caption_spans(blocks, refs)
    T = int(lengths.max()) + 2
    ids = np.full((B, T), tok.pad_id, dtype=np.int64)
    ids[:, 0] = tok.cls_id
    ids[np.arange(B), lengths + 1] = tok.sep_id
    ex, pos = np.repeat(np.arange(B), lengths), ranges(lengths)
    src = np.repeat(starts, lengths) + pos
    for b in np.unique(refs.text_block):   # tokens live in each block's own buffer
        m = refs.text_block[ex] == b
        ids[ex[m], pos[m] + 1] = blocks[b].tokens[src[m]]
    mask = (np.arange(T)[None, :] < (lengths + 2)[:, None]).astype(np.int64)
    return {K.INPUT_IDS: ids, K.TEXT_MASK: mask, TEXT_KEYS: keys}


def region_arrays(blocks: list[ImageBlock], refs: ExampleRefs, feature_dim: int, loc_dim: int,
                  num_classes: int | None, need_soft: bool) -> dict[str, np.ndarray]:
    B = len(refs)
    first, n, keys = image_spans(blocks, refs)
    N = int(n.max())
    # the rows stay fp16 as stored (see batch_spec.REGION_FEATS)
    feats = np.zeros((B * N, feature_dim), dtype=np.float16)
    loc = np.zeros((B * N, loc_dim), dtype=np.float32)
    soft = np.zeros((B * N, num_classes), dtype=np.float16) if need_soft else None
    ex, pos = np.repeat(np.arange(B), n), ranges(n)
    src, dst = np.repeat(first, n) + pos, np.repeat(np.arange(B) * N, n) + pos
    for b in np.unique(refs.image_block):
        m = refs.image_block[ex] == b
        feats[dst[m]] = blocks[b].features[src[m]]
        loc[dst[m]] = blocks[b].region_loc[src[m]]
        if need_soft:
            soft[dst[m]] = blocks[b].soft_labels[src[m]]
    feats = feats.reshape(B, N, feature_dim)
    loc = loc.reshape(B, N, loc_dim)
    if need_soft:
        soft = soft.reshape(B, N, num_classes)
    out = {K.REGION_FEATS: feats, K.REGION_LOC: loc,
           K.REGION_MASK: (np.arange(N)[None, :] < n[:, None]).astype(np.int64),
           IMAGE_KEYS: keys}
    if need_soft:
        out[SOFT_LABELS] = soft
    out.update(whole_image_arrays(blocks, refs, feature_dim))
    return out


def whole_image_arrays(blocks: Mapping[int, ImageBlock], refs: ExampleRefs, feature_dim: int
                       ) -> dict[str, np.ndarray]:
    """Each example's whole-image RoI feature (VL-BERT), when every block read one."""
    used = [blocks[b] for b in np.unique(refs.image_block)]
    if not used or any(b.image_feature is None for b in used):
        return {}
    whole = np.zeros((len(refs), feature_dim), np.float16)
    has = np.zeros(len(refs), bool)
    for b in np.unique(refs.image_block):
        sel = np.flatnonzero(refs.image_block == b)
        whole[sel] = blocks[b].image_feature[refs.image_row[sel]]
        has[sel] = blocks[b].has_image_feature[refs.image_row[sel]]
    return {WHOLE_FEAT: whole, HAS_WHOLE: has}


def image_idents(refs: ExampleRefs) -> np.ndarray:
    """One int64 per example naming its image (block and row), equal for equal images."""
    return refs.image_block.astype(np.int64) * (1 << 32) + refs.image_row


def pixel_arrays(blocks: list[ImageBlock], refs: ExampleRefs, cfg: PixelConfig
                 ) -> dict[str, np.ndarray]:
    ident = image_idents(refs)
    uniq, first, index = np.unique(ident, return_index=True, return_inverse=True)
    images = [blocks[refs.image_block[i]].image(refs.image_row[i]) for i in first]
    pixels, mask = pad_images(images, cfg)
    keys = np.array([blocks[refs.image_block[i]].image_key[refs.image_row[i]] for i in first],
                    dtype=np.int64)
    return {K.PIXELS: pixels, K.PIXEL_MASK: mask, K.IMAGE_INDEX: index.astype(np.int64),
            IMAGE_KEYS: keys[index]}


def collate_examples(blocks: list[ImageBlock], refs: ExampleRefs, tok: TextTokenizer, *,
                     visual: str, feature_dim: int = 0, loc_dim: int = 0,
                     num_classes: int | None = None, need_soft: bool = False,
                     pixel_cfg: PixelConfig | None = None) -> dict[str, np.ndarray]:
    """The unmasked batch: text, the visual side, ``positive`` and the unit counts."""
    batch = text_arrays(blocks, refs, tok)
    B, T = batch[K.INPUT_IDS].shape
    if visual == "regions":
        batch.update(region_arrays(blocks, refs, feature_dim, loc_dim, num_classes, need_soft))
        # the model packs text then regions per row: the batch costs B × the longest row
        units = B * int((batch[K.TEXT_MASK].sum(1) + batch[K.REGION_MASK].sum(1)).max())
    else:
        batch.update(pixel_arrays(blocks, refs, pixel_cfg))
        H, W = batch[K.PIXELS].shape[2:]
        units = B * (T + visual_tokens(H, W, pixel_cfg))
    batch[K.POSITIVE] = refs.positive.astype(bool)
    batch[K.NUM_EXAMPLES] = np.array(B, dtype=np.int64)
    batch[K.INPUT_UNITS] = np.array(units, dtype=np.int64)
    return batch
