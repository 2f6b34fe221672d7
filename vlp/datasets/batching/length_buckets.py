"""Batches by input units with length bucketing (UNITER's TokenBucketSampler, streaming).

A window of items (an item = one example, or in pixel mode one image with its texts) is
sorted by length and cut greedily so that each batch's cost stays within the budget, then the
batch order is shuffled. The cost of a batch is what the model computes on:

- ``packed`` (region input): the model packs each example's text and regions into one row
  with no padding between them (UNITER), so a batch costs ``examples × max(text + regions)``;
  items are sorted by that total length.
- not packed (pixel input): text and visual tokens are padded separately, so a batch costs
  ``examples × (max text + max visual)``; items are split into bands by visual length and each
  band is sorted by text length, the number of bands balancing the spread of the two.
"""

from __future__ import annotations

import math

import numpy as np


def bucket_batches(text_len: np.ndarray, visual_len: np.ndarray, budget: int,
                   rng: np.random.Generator, *, examples: np.ndarray | None = None,
                   packed: bool = True, sort: bool = True, keep_tails: bool = True,
                   max_examples: int = 0, widths: np.ndarray | None = None,
                   aged: np.ndarray | None = None
                   ) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Split item indices into batches; returns (batches in shuffled order, tails).

    A batch holds at most ``budget`` input units (examples × its longest row) and, when
    ``max_examples`` > 0, at most that many examples (a paper's batch in pairs: VL-BERT's 256;
    an item bringing more examples than that alone still makes a batch of its own).

    ``examples[i]`` is how many examples item i contributes (1 by default). With
    ``keep_tails=False`` the last, partly filled batch of each band is returned in ``tails``
    instead, for the caller to carry into the next window. ``sort=False`` cuts in random
    order: the no-bucketing baseline. ``widths`` (packed only; ascending, the last holding any
    item): a batch costs its examples × its longest row rounded up to one of these
    (``fixed_shapes``), so it never has more rows than its shape.

    With ``widths`` and ``keep_tails=False`` each width band's last, partly filled batch is a
    tail of its own (carried into the next window, where it fills up in its band), unless it
    holds an ``aged`` item (one carried once already): such tails are cut again across the
    bands and emitted. Within a band every row pads to the band's width, so the order there
    is free: ``aged`` items go first, into the band's full batches, and a band's tail is
    fresh whenever the band fills a batch at all."""
    if widths is not None and not packed:
        raise ValueError("fixed widths apply to packed (region) batches only")
    n = len(text_len)
    T = np.asarray(text_len, np.int64)
    V = np.asarray(visual_len, np.int64)
    E = np.ones(n, np.int64) if examples is None else np.asarray(examples, np.int64)
    if n == 0:
        return [], []
    order = rng.permutation(n)   # random tie-break: equal lengths are not grouped by source
    old = np.zeros(n, bool) if aged is None else np.asarray(aged, bool)
    if not sort:
        chunks = [order]
    elif packed and widths is not None:   # a band per width: no batch straddles two
        band_of = np.searchsorted(widths, T + V)
        order = order[np.lexsort((~old[order], band_of[order]))]   # by band, aged first
        band = band_of[order]
        chunks = [c for c in np.split(order, np.flatnonzero(np.diff(band)) + 1) if len(c)]
    elif packed:
        chunks = [order[np.argsort((T + V)[order], kind="stable")]]
    else:
        bands = _band_count(T, V, E, budget)
        order = order[np.lexsort((T[order], V[order]))]
        chunks = [c[np.lexsort((V[c], T[c]))] for c in np.array_split(order, bands)]
    batches, tails, partial = [], [], []
    for chunk in chunks:
        cut = _greedy_cut(chunk, T, V, E, budget, packed, max_examples, widths)
        if widths is not None and not keep_tails and cut and not old[cut[-1]].any():
            tails.append(cut.pop())              # fresh: fills up in the next window
        elif len(chunks) > 1 and widths is not None and cut:
            partial.append(cut.pop())
        elif not keep_tails and cut:
            tails.append(cut.pop())
        batches += cut
    if partial:   # the width bands' last, partly filled batches: cut again across the bands
        cut = _greedy_cut(np.concatenate(partial), T, V, E, budget, packed, max_examples,
                          widths)
        if not keep_tails:
            tails.append(cut.pop())
        batches += cut
    perm = rng.permutation(len(batches))
    return [batches[i] for i in perm], tails


def batch_cost(T: np.ndarray, V: np.ndarray, E: np.ndarray, packed: bool) -> int:
    """Input units of one batch made of these items."""
    width = int((T + V).max()) if packed else int(T.max()) + int(V.max())
    return int(E.sum()) * width


def _band_count(T: np.ndarray, V: np.ndarray, E: np.ndarray, budget: int) -> int:
    """Bands by visual length: with k batches in the window and spreads sT, sV, padding per
    example ≈ sT/bands_T + sV/bands_V with bands_T·bands_V = k → bands_V = √(k·sV/sT)."""
    k = max(1, int(np.sum(E * (T + V)) // budget))
    sT, sV = float(np.std(T)), float(np.std(V))
    if sV == 0:
        return 1
    if sT == 0:
        return min(k, len(T))
    return int(np.clip(round(math.sqrt(k * sV / sT)), 1, min(k, len(T))))


def _greedy_cut(idx: np.ndarray, T, V, E, budget: int, packed: bool,
                max_examples: int = 0, widths: np.ndarray | None = None) -> list[np.ndarray]:
    cap = max_examples or np.iinfo(np.int64).max
    batches, start, count, mt, mv = [], 0, 0, 0, 0
    t, v, e = T[idx].tolist(), V[idx].tolist(), E[idx].tolist()
    if widths is not None:   # each item's width rounded up the ladder: the running maximum
        rounded = np.asarray(widths)[np.searchsorted(widths, T[idx] + V[idx])].tolist()
    for j in range(len(idx)):
        if widths is not None:
            nt, nv = max(mt, rounded[j]), 0
        elif packed:   # one running maximum of the total length (mv stays 0)
            nt, nv = max(mt, t[j] + v[j]), 0
        else:
            nt, nv = max(mt, t[j]), max(mv, v[j])
        if count and ((count + e[j]) * (nt + nv) > budget or count + e[j] > cap):
            batches.append(idx[start:j])
            start, count = j, 0
            if widths is not None:
                nt, nv = rounded[j], 0
            else:
                nt, nv = (t[j] + v[j], 0) if packed else (t[j], v[j])
        count += e[j]
        mt, mv = nt, nv
    batches.append(idx[start:])
    return batches


def padding_waste(text_len: np.ndarray, visual_len: np.ndarray, batches: list[np.ndarray],
                  examples: np.ndarray | None = None, packed: bool = True) -> float:
    """Share of the batches' input units that are padding."""
    T = np.asarray(text_len, np.int64)
    V = np.asarray(visual_len, np.int64)
    E = np.ones(len(T), np.int64) if examples is None else np.asarray(examples, np.int64)
    real = sum(int(np.sum(E[b] * (T[b] + V[b]))) for b in batches)
    padded = sum(batch_cost(T[b], V[b], E[b], packed) for b in batches)
    return 1.0 - real / padded if padded else 0.0
