"""Batches by input units with length bucketing (UNITER's TokenBucketSampler, streaming).

A window of items (an item = one example, or in pixel mode one image with its texts) is
sorted by length and cut greedily so that ``examples × (max text + max visual) ≤ budget``:
text and visual inputs are padded separately, so that product is the size of the tensors the
model receives. Batch order is then shuffled. Two lengths vary (text tokens, regions): items
are first split into bands by visual length and each band sorted by text length; the number
of bands balances the spread of the two (one band when regions are fixed, e.g. 36).
"""

from __future__ import annotations

import math

import numpy as np


def bucket_batches(text_len: np.ndarray, visual_len: np.ndarray, budget: int,
                   rng: np.random.Generator, *, examples: np.ndarray | None = None,
                   sort: bool = True, keep_tails: bool = True
                   ) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Split item indices into batches; returns (batches in shuffled order, tails).

    ``examples[i]`` is how many examples item i contributes (1 by default). With
    ``keep_tails=False`` the last, partly filled batch of each band is returned in ``tails``
    instead, for the caller to carry into the next window. ``sort=False`` cuts in the given
    (random) order: the no-bucketing baseline."""
    n = len(text_len)
    T = np.asarray(text_len, np.int64)
    V = np.asarray(visual_len, np.int64)
    E = np.ones(n, np.int64) if examples is None else np.asarray(examples, np.int64)
    if n == 0:
        return [], []
    order = rng.permutation(n)   # random tie-break: equal lengths are not grouped by source
    if sort:
        bands = _band_count(T, V, E, budget)
        order = order[np.lexsort((T[order], V[order]))]
        chunks = [c[np.lexsort((V[c], T[c]))] for c in np.array_split(order, bands)]
    else:
        chunks = [order]
    batches, tails = [], []
    for chunk in chunks:
        cut = _greedy_cut(chunk, T, V, E, budget)
        if not keep_tails and cut:
            tails.append(cut.pop())
        batches += cut
    perm = rng.permutation(len(batches))
    return [batches[i] for i in perm], tails


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


def _greedy_cut(idx: np.ndarray, T, V, E, budget: int) -> list[np.ndarray]:
    batches, start, count, mt, mv = [], 0, 0, 0, 0
    t, v, e = T[idx].tolist(), V[idx].tolist(), E[idx].tolist()
    for j in range(len(idx)):
        nt, nv = max(mt, t[j]), max(mv, v[j])
        if count and (count + e[j]) * (nt + nv) > budget:
            batches.append(idx[start:j])
            start, count, nt, nv = j, 0, t[j], v[j]
        count += e[j]
        mt, mv = nt, nv
    batches.append(idx[start:])
    return batches


def padding_waste(text_len: np.ndarray, visual_len: np.ndarray,
                  batches: list[np.ndarray], examples: np.ndarray | None = None) -> float:
    """Share of the batches' input units that are padding."""
    T = np.asarray(text_len, np.int64)
    V = np.asarray(visual_len, np.int64)
    E = np.ones(len(T), np.int64) if examples is None else np.asarray(examples, np.int64)
    real = padded = 0
    for b in batches:
        real += int(np.sum(E[b] * (T[b] + V[b])))
        padded += int(E[b].sum()) * (int(T[b].max()) + int(V[b].max()))
    return 1.0 - real / padded if padded else 0.0
