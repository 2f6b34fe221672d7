"""Collate every batch of a window in one pass (region input), and swap ITM negatives in a
collated batch.

Collating batch by batch cost ~40 numpy calls per batch, each dearer than the bytes it moved
(a demo-world batch is ~240 pairs). Here a window's batches share flat buffers: one scatter
places every token, one index array (into the source blocks' rows laid end to end) places
every region row, and each batch is a set of views into the buffers (disjoint, so a task may
mask its batch in place). The arrays are exactly those ``collate_examples`` gives for the
same references, batch by batch.

The task of a batch is not known when the window is cut, so batches are collated unmasked and
as positives; an ITM batch then swaps in its donors' rows (``swap_negatives``), which gives
the arrays that collating the swapped references would.

Region rows are not copied when the window is collated. A window holds every (image,
caption) pair, so gathering its region arrays copies each image's 2048-d feature rows once per
caption: gigabytes of fresh memory a window at uniter-base's batch size (its page faults cost
more than the copy), held while the window's batches are served over many steps. A batch holds
instead the rows its region arrays come from (``REGION_ROWS``, swapped and trimmed by an ITM
batch like any other image-side array) and the window's blocks (``REGION_SOURCE``, the
rows' numbering: the blocks' rows end to end, a zero row after them for the padding);
``resolve_regions`` gathers features and locations for
the batch when it is served, and soft labels (the detector's class distribution, C = 1,601
fp16 values a region, as many bytes as a feature) only when its task reads them (MRC: one batch
in six in UNITER's mix). The gathered arrays are those the eager gather gave: the same rows
of the same sources.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from vlp.contract import batch_spec as K
from vlp.datasets.storage.arrow_views import ranges
from vlp.datasets.batching.collate import (HAS_WHOLE, IMAGE_KEYS, TEXT_KEYS, WHOLE_FEAT,
                                           ExampleRefs, caption_spans, image_spans,
                                           whole_image_arrays)
from vlp.datasets.batching.image_block import ImageBlock
from vlp.datasets.batching.itm_negatives import Donors
from vlp.tasks.masking_visual import SOFT_LABELS
from vlp.datasets.stream.text_tokenizer import TextTokenizer

Batch = dict[str, np.ndarray]
REGION_ROWS = "_region_rows"       # int64 [B, N]: the batch's rows of REGION_SOURCE
REGION_SOURCE = "_region_source"   # WindowRegions: the window's region rows


class WindowRegions:
    """The region rows of a window's blocks, numbered as if laid end to end with a zero row
    after them (the padding), and gathered from the blocks themselves: laying them end to end
    would copy the window's images once more. Not an array, so that copying a batch's arrays
    (one copy per task of a summed set) shares it."""

    def __init__(self, blocks: list[ImageBlock], soft: bool):
        self.blocks = blocks
        self.soft = soft   # whether the blocks hold soft labels to gather (MRC in the plan)
        self.starts = np.concatenate([[0], np.cumsum([len(b.features) for b in blocks])])

    def gather(self, idx: np.ndarray, names: tuple[str, ...]) -> list[np.ndarray]:
        """Arrays ``names`` of the blocks at rows ``idx`` (any shape; the zero row past the
        last block's rows gives zeros), shaped ``idx.shape + (width,)``."""
        flat = idx.reshape(-1)
        order = np.argsort(flat, kind="stable")   # by block: one gather per block
        rows = flat[order]
        cut = np.searchsorted(rows, self.starts)
        parts = [getattr(self.blocks[0], name) for name in names]
        outs = [np.zeros((len(flat), p.shape[1]), p.dtype) for p in parts]
        for j, blk in enumerate(self.blocks):
            lo, hi = cut[j], cut[j + 1]
            if lo == hi:
                continue
            dst, src = order[lo:hi], rows[lo:hi] - self.starts[j]
            for out, name in zip(outs, names):
                out[dst] = getattr(blk, name)[src]
        return [o.reshape(*idx.shape, o.shape[1]) for o in outs]


def resolve_regions(batch: Batch, need_soft: bool) -> None:
    """Gather a batch's REGION_FEATS and REGION_LOC (where the row references stood, so the
    keys keep the order of an eager collate) and SOFT_LABELS if its task reads them; drop the
    row references (in place)."""
    if REGION_ROWS not in batch:
        return
    source, rows = batch[REGION_SOURCE], batch[REGION_ROWS]
    items = [(k, v) for k, v in batch.items() if k != REGION_SOURCE]
    batch.clear()
    soft = need_soft and source.soft
    names = ("features", "region_loc") + (("soft_labels",) if soft else ())
    arrays = source.gather(rows, names)
    for k, v in items:
        if k == REGION_ROWS:
            batch[K.REGION_FEATS], batch[K.REGION_LOC] = arrays[:2]
        else:
            batch[k] = v
    if soft:
        batch[SOFT_LABELS] = arrays[2]


def collate_window(blocks: Mapping[int, ImageBlock], batches: list[ExampleRefs],
                   tok: TextTokenizer, *, feature_dim: int, need_soft: bool) -> list[Batch]:
    """The unmasked batches (text, regions, ``positive``, unit counts) of ``batches``."""
    if not batches:
        return []
    sizes = np.array([len(b) for b in batches], np.int64)
    first = np.concatenate([[0], np.cumsum(sizes)])            # example offsets per batch
    refs = ExampleRefs.concat(batches)
    E = len(refs)
    batch_of = np.repeat(np.arange(len(batches)), sizes)
    slot = np.arange(E) - first[batch_of]                      # row within its batch

    # per example: where its caption's word pieces are, its image's region rows, identities
    tok_at, n_tok, text_key = caption_spans(blocks, refs)
    reg_at, n_reg, image_key = image_spans(blocks, refs)

    # text: [CLS] pieces [SEP] [PAD]… rows of each batch's own width, gathered in one take
    # from the blocks' pieces with the three special ids appended
    text_blocks = np.unique(refs.text_block)
    pieces, tok_base = _concat_rows([blocks[b].tokens for b in text_blocks],
                                    np.array([tok.pad_id, tok.cls_id, tok.sep_id], np.int32))
    tok_at = tok_base[np.searchsorted(text_blocks, refs.text_block)] + tok_at
    pad, cls, sep = len(pieces) - 3, len(pieces) - 2, len(pieces) - 1
    T = np.maximum.reduceat(n_tok, first[:-1]) + 2
    t_off = np.concatenate([[0], np.cumsum(sizes * T)])
    row = t_off[batch_of] + slot * T[batch_of]                 # flat index of each [CLS]
    take = np.full(int(t_off[-1]), pad, np.int64)
    take[row] = cls
    take[row + n_tok + 1] = sep
    ex, pos = np.repeat(np.arange(E), n_tok), ranges(n_tok)
    take[row[ex] + 1 + pos] = tok_at[ex] + pos
    ids = pieces[take].astype(np.int64)
    text_mask = np.zeros(len(ids), np.int64)
    text_mask[np.repeat(row, n_tok + 2) + ranges(n_tok + 2)] = 1

    # regions: rows padded to each batch's most regions (fp16 as stored), numbered in the
    # blocks' rows laid end to end with a zero row after them for the padding
    image_blocks = np.unique(refs.image_block)
    source = WindowRegions([blocks[b] for b in image_blocks], need_soft)
    starts = source.starts
    reg_at = starts[np.searchsorted(image_blocks, refs.image_block)] + reg_at
    N = np.maximum.reduceat(n_reg, first[:-1])
    r_off = np.concatenate([[0], np.cumsum(sizes * N)])
    rrow = r_off[batch_of] + slot * N[batch_of]
    rows_total = int(r_off[-1])
    take = np.full(rows_total, starts[-1], np.int64)          # the zero row
    ex, pos = np.repeat(np.arange(E), n_reg), ranges(n_reg)
    dst = rrow[ex] + pos
    take[dst] = reg_at[ex] + pos
    region_mask = np.zeros(rows_total, np.int64)
    region_mask[dst] = 1
    whole = whole_image_arrays(blocks, refs, feature_dim)      # per example: no padding

    width = np.maximum.reduceat(n_tok + 2 + n_reg, first[:-1])   # the packed row
    out = []
    for i in range(len(batches)):
        s, e, B, t, n = first[i], first[i + 1], sizes[i], T[i], N[i]
        ts, rs = slice(t_off[i], t_off[i + 1]), slice(r_off[i], r_off[i + 1])
        batch = {K.INPUT_IDS: ids[ts].reshape(B, t), K.TEXT_MASK: text_mask[ts].reshape(B, t),
                 TEXT_KEYS: text_key[s:e],
                 REGION_ROWS: take[rs].reshape(B, n), REGION_SOURCE: source,
                 K.REGION_MASK: region_mask[rs].reshape(B, n), IMAGE_KEYS: image_key[s:e]}
        for k, v in whole.items():
            batch[k] = v[s:e]
        batch[K.POSITIVE] = refs.positive[s:e].astype(bool)
        batch[K.NUM_EXAMPLES] = np.array(B, dtype=np.int64)
        batch[K.INPUT_UNITS] = np.array(B * width[i], dtype=np.int64)
        out.append(batch)
    return out


TEXT_SIDE = (K.INPUT_IDS, K.TEXT_MASK, TEXT_KEYS)
# a collated batch's image side: its region arrays are still row references (resolve_regions)
IMAGE_SIDE = (K.REGION_MASK, IMAGE_KEYS, REGION_ROWS, WHOLE_FEAT, HAS_WHOLE)


def swap_negatives(batch: Batch, donors: Donors) -> Batch:
    """A collated batch with its ITM negatives' images (or texts) taken from their donors,
    trimmed to the widths the swapped batch needs. The rows are swapped in place (a batch's
    views are its own); the trimmed arrays come back in a new dict."""
    out = dict(batch)
    for idx, give, keys in ((*donors.image_swaps(), IMAGE_SIDE),
                            (*donors.text_swaps(), TEXT_SIDE)):
        for k in keys:
            if k in out and len(idx):
                out[k][idx] = out[k][give]   # the right side is gathered first: chains are safe
    t = out[K.TEXT_MASK].sum(1)
    n = out[K.REGION_MASK].sum(1)
    T, N = int(t.max()), int(n.max())
    if T < out[K.INPUT_IDS].shape[1]:   # the longest text went to no one
        for k in (K.INPUT_IDS, K.TEXT_MASK):
            out[k] = np.ascontiguousarray(out[k][:, :T])
    if N < out[K.REGION_MASK].shape[1]:
        for k in (K.REGION_MASK, REGION_ROWS):
            out[k] = np.ascontiguousarray(out[k][:, :N])
    out[K.POSITIVE] = batch[K.POSITIVE] & ~donors.negative
    out[K.INPUT_UNITS] = np.array(len(t) * int((t + n).max()), dtype=np.int64)
    return out


def _concat_rows(parts: list[np.ndarray], tail: np.ndarray | None
                 ) -> tuple[np.ndarray, np.ndarray]:
    """The parts end to end (then ``tail``), and where each part starts."""
    starts = np.concatenate([[0], np.cumsum([len(p) for p in parts])]).astype(np.int64)
    return np.concatenate(parts + ([tail] if tail is not None else [])), starts[:-1]
