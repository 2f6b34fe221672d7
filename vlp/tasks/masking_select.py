"""Choosing positions to mask: Bernoulli(p) per eligible position, at least one per row."""

from __future__ import annotations

import numpy as np


def choose_positions(eligible: np.ndarray, prob: float, rng: np.random.Generator) -> np.ndarray:
    """Boolean array like ``eligible``: each eligible position with probability ``prob``; a
    row with eligible positions but none drawn gets one, uniformly among its eligible ones
    (BERT/UNITER: every example has at least one masked position)."""
    chosen = eligible & (rng.random(eligible.shape) < prob)
    empty = eligible.any(axis=1) & ~chosen.any(axis=1)
    if empty.any():
        rows = np.flatnonzero(empty)
        scores = rng.random((len(rows), eligible.shape[1])) * eligible[rows]
        chosen[rows, scores.argmax(axis=1)] = True
    return chosen
