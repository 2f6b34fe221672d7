"""The worker-side batcher: image blocks in, batches of example references out.

Blocks of image rows are expanded into items as they arrive (region input: one item per
(image, caption) pair; pixel input: one item per image, which gets its SOHO texts when the
window is cut). Each item is kept ``floor(rate) + Bernoulli(frac(rate))`` times, ``rate`` being
its source's sampling rate, so the stream follows the configured source weights. Once the
window holds ``bucket_window`` examples it is bucketed into batches by input units (see
``batching``); the last,
partly filled batch of each length band is carried into the next window once (so batches stay
full), then emitted whatever its fill (so no example waits longer than one window).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vlp.datasets.batching.fixed_shapes import ShapeSet, fit_shapes
from vlp.datasets.batching.length_buckets import bucket_batches
from vlp.datasets.batching.collate import ExampleRefs
from vlp.datasets.stream.data_plan import DataPlan
from vlp.datasets.batching.image_block import ImageBlock, gather_images
from vlp.datasets.stream.pixels import visual_tokens


@dataclass
class Items:
    block: np.ndarray
    row: np.ndarray
    cap: np.ndarray      # caption index (region input); -1 for pixel items (whole images)
    aged: np.ndarray     # bool: already carried once

    @staticmethod
    def empty() -> "Items":
        z = np.zeros(0, np.int64)
        return Items(z, z, z, np.zeros(0, bool))

    @staticmethod
    def concat(parts: list["Items"]) -> "Items":
        if not parts:
            return Items.empty()
        return Items(*(np.concatenate([getattr(p, f) for p in parts])
                       for f in ("block", "row", "cap", "aged")))

    def take(self, idx: np.ndarray) -> "Items":
        return Items(self.block[idx], self.row[idx], self.cap[idx], self.aged[idx])

    def __len__(self) -> int:
        return len(self.block)


class ExampleWindow:
    def __init__(self, plan: DataPlan, rng: np.random.Generator):
        self.plan = plan
        self.cfg = plan.config
        self.rng = rng
        self.rates = np.asarray(plan.rates, dtype=np.float64)
        self._pending: list[Items] = []
        self._carry = Items.empty()
        self.pending_examples = 0
        # data.fixed_shapes: the batch shapes, fitted to the first window cut (region input)
        self.shapes: ShapeSet | None = None
        pix = self.cfg.pixels
        self._texts_per_image = pix.pos_texts_per_image + pix.neg_texts_per_image

    # ---- ingestion ------------------------------------------------------------------------

    def ingest(self, block_id: int, block: ImageBlock) -> int:
        """Expand a block into items (with source sampling); returns examples added."""
        n_caps = block.num_captions()
        rate = self.rates[block.source_index]
        if self.cfg.visual == "regions":
            row = np.repeat(np.arange(block.num_images), n_caps)
            cap = np.arange(len(row)) - np.repeat(block.cap_start[:-1], n_caps)
            copies = self._copies(rate[row])
            items = Items(np.full(copies.sum(), block_id, np.int64), np.repeat(row, copies),
                          np.repeat(cap, copies), np.zeros(copies.sum(), bool))
            added = len(items)
        else:
            has = np.flatnonzero(n_caps > 0)
            copies = self._copies(rate[has])
            rows = np.repeat(has, copies)
            items = Items(np.full(len(rows), block_id, np.int64), rows,
                          np.full(len(rows), -1, np.int64), np.zeros(len(rows), bool))
            added = len(items) * self._texts_per_image
        self._pending.append(items)
        self.pending_examples += added
        return added

    def _copies(self, rate: np.ndarray) -> np.ndarray:
        base = np.floor(rate)
        return (base + (self.rng.random(len(rate)) < rate - base)).astype(np.int64)

    def referenced_blocks(self) -> set[int]:
        ids = {int(b) for p in self._pending for b in np.unique(p.block)}
        return ids | {int(b) for b in np.unique(self._carry.block)}

    # ---- cutting ----------------------------------------------------------------------------

    def cut(self, blocks: dict[int, ImageBlock], final: bool, merged_id: int
            ) -> tuple[list[ExampleRefs], ImageBlock | None]:
        """Pixel input: bucket the pending items (and the carried ones) into batches.
        ``final`` (end of an epoch) emits everything; otherwise fresh tails are carried into
        the next window.

        Every image the batches and the carried items refer to is gathered into one block,
        returned to be registered under ``merged_id``: batches and carry then refer only to
        it, and the blocks the window was read from can be released."""
        items = self._take_items()
        if not len(items):
            return [], None
        refs, T, V, E, owner = self._pixel_examples(blocks, items)
        n_ex = len(refs)
        merged, index = gather_images(
            blocks, np.concatenate([refs.text_block, refs.image_block, items.block]),
            np.concatenate([refs.text_row, refs.image_row, items.row]))
        refs = refs.with_(text_block=np.full(n_ex, merged_id), text_row=index[:n_ex],
                          image_block=np.full(n_ex, merged_id),
                          image_row=index[n_ex:2 * n_ex])
        items = Items(np.full(len(items), merged_id, np.int64), index[2 * n_ex:], items.cap,
                      items.aged)
        batches, tails = bucket_batches(T, V, self.cfg.batch_units, self.rng, examples=E,
                                        packed=False, sort=self.cfg.bucketing,
                                        keep_tails=final,
                                        max_examples=self.cfg.batch_examples)
        self._carry_tails(items, tails, E, batches)
        order = np.argsort(owner, kind="stable")
        starts = np.searchsorted(owner[order], np.arange(len(items) + 1))
        out = []
        for b in batches:   # item indices → the examples they own
            ex = np.concatenate([order[starts[i]:starts[i + 1]] for i in b])
            out.append(refs.take(ex))
        return out, merged

    def cut_refs(self, blocks: dict[int, ImageBlock], final: bool) -> list[ExampleRefs]:
        """Region input: bucket the window's (image, caption) pairs into batches, which refer
        to the blocks the pairs were read from (``collate_window`` reads them there); tails
        are carried as in ``cut``."""
        items = self._take_items()
        if not len(items):
            return []
        refs, T, V, E, _ = self._pair_examples(blocks, items)   # one example per item
        widths = None
        if self.cfg.fixed_shapes:
            if self.shapes is None:
                cfg = self.cfg
                self.shapes = fit_shapes(T, V, budget=cfg.batch_units, count=cfg.shape_buckets,
                                         text_cap=cfg.max_text_len + 2,
                                         region_cap=cfg.regions.max_per_image(),
                                         mask_prob=cfg.mask_prob)
            widths = np.asarray(self.shapes.widths)
        batches, tails = bucket_batches(T, V, self.cfg.batch_units, self.rng, examples=E,
                                        packed=True, sort=self.cfg.bucketing,
                                        keep_tails=final,
                                        max_examples=self.cfg.batch_examples, widths=widths,
                                        aged=items.aged)
        self._carry_tails(items, tails, E, batches)
        return [refs.take(b) for b in batches if len(b)]

    def _take_items(self) -> Items:
        """The carried items and the pending ones; the window starts empty again."""
        items = Items.concat([self._carry] + self._pending)
        self._pending, self._carry, self.pending_examples = [], Items.empty(), 0
        return items

    def _carry_tails(self, items: Items, tails: list[np.ndarray], E: np.ndarray,
                     batches: list[np.ndarray]) -> None:
        """Carry each fresh tail into the next window; emit those carried once already."""
        for tail in tails:
            if items.aged[tail].any():
                batches.append(tail)          # carried once already: emit now
            else:
                carried = items.take(tail)
                carried.aged[:] = True
                self._carry = Items.concat([self._carry, carried])
                self.pending_examples += int(E[tail].sum())

    def _pair_examples(self, blocks, items: Items):
        T = np.empty(len(items), np.int64)
        V = np.empty(len(items), np.int64)
        for b in np.unique(items.block):
            sel = np.flatnonzero(items.block == b)
            blk = blocks[b]
            g = blk.cap_start[items.row[sel]] + items.cap[sel]
            T[sel] = blk.tok_start[g + 1] - blk.tok_start[g] + 2
            V[sel] = blk.num_regions[items.row[sel]]
        refs = ExampleRefs(items.block, items.row, items.cap, items.block, items.row,
                           np.ones(len(items), bool))
        return refs, T, V, np.ones(len(items), np.int64), np.arange(len(items))

    def _pixel_examples(self, blocks, items: Items):
        """SOHO: each image gets up to ``pos_texts_per_image`` of its captions and
        ``neg_texts_per_image`` captions of other images of the window's blocks (whole blocks,
        so that a small window at an epoch's end still has other images to draw from)."""
        pix = self.cfg.pixels
        pool_block, pool_row, pool_cap, pool_key, pool_len = [], [], [], [], []
        for b in np.unique(items.block):   # negatives: any caption of the window's blocks
            blk = blocks[b]
            rows = np.arange(blk.num_images)
            n = blk.num_captions()
            r = np.repeat(rows, n)
            c = np.arange(len(r)) - np.repeat(np.concatenate([[0], np.cumsum(n)[:-1]]), n)
            g = blk.cap_start[r] + c
            pool_block.append(np.full(len(r), b, np.int64))
            pool_row.append(r)
            pool_cap.append(c)
            pool_key.append(blk.image_key[r])
            pool_len.append(blk.tok_start[g + 1] - blk.tok_start[g] + 2)
        pb, pr, pc, pk, pl = (np.concatenate(x) for x in
                              (pool_block, pool_row, pool_cap, pool_key, pool_len))
        ex_parts: list[tuple] = []
        T = np.empty(len(items), np.int64)
        V = np.empty(len(items), np.int64)
        E = np.empty(len(items), np.int64)
        for i in range(len(items)):
            b, r = int(items.block[i]), int(items.row[i])
            blk = blocks[b]
            key = blk.image_key[r]
            n = int(blk.num_captions()[r])
            pos = self.rng.choice(n, size=min(pix.pos_texts_per_image, n), replace=False)
            neg = self._negatives(pk, key, pix.neg_texts_per_image)
            g = blk.cap_start[r] + pos
            lens = np.concatenate([blk.tok_start[g + 1] - blk.tok_start[g] + 2, pl[neg]])
            k = len(pos) + len(neg)
            ex_parts.append((np.concatenate([np.full(len(pos), b), pb[neg]]),
                             np.concatenate([np.full(len(pos), r), pr[neg]]),
                             np.concatenate([pos, pc[neg]]),
                             np.full(k, b), np.full(k, r),
                             np.arange(k) < len(pos), np.full(k, i)))
            h, w = blk.pixel_hw[r]
            m = pix.pad_multiple
            T[i], E[i] = lens.max(), k
            V[i] = visual_tokens(-(-h // m) * m, -(-w // m) * m, pix)
        cols = [np.concatenate([p[j] for p in ex_parts]) for j in range(7)]
        refs = ExampleRefs(*(c.astype(np.int64) for c in cols[:5]), cols[5].astype(bool))
        return refs, T, V, E, cols[6].astype(np.int64)

    def _negatives(self, pool_keys: np.ndarray, key: int, k: int) -> np.ndarray:
        if k == 0:
            return np.zeros(0, np.int64)
        other = pool_keys != key
        if not other.any():
            return np.zeros(0, np.int64)   # the window holds one image only
        cand = self.rng.integers(0, len(pool_keys), size=4 * k)
        cand = cand[other[cand]][:k]
        if len(cand) < k:
            cand = self.rng.choice(np.flatnonzero(other), size=k)
        return cand
