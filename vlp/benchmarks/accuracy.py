"""Accuracy in percent (scores are percentages, the unit of UNITER's Table 3), fair under
tied scores.

Every argmax that decides a score (NLVR2, SNLI-VE, VCR, VQA, RefCOCO+'s box) is credited as
the EXPECTED score under uniform random tie-breaking: a row whose best score is shared by m
choices, j of them right, earns j/m. Why this and not "ties against the model": a model that
outputs one constant (collapsed, or saturated in fp16) then scores exactly chance — 50 on
NLVR2, 1/C on a C-way choice, K/N on retrieval R@K — which is what it knows; ties against the
model would score it 0, below chance, and ties for the model (argmax's first index, or
counting only strictly higher scores) can score it 100. With no ties the expected score is
the plain argmax accuracy, so untied results are unchanged.

A non-finite score (NaN, ±inf: a model diverged, or overflowed in fp16/bf16) scores nothing:
it ranks below every finite score of its row and is never a hit, so a row with no finite
score earns 0 — not the first index (argmax of NaN) nor a NaN accuracy.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def accuracy(predictions: Sequence, labels: Sequence) -> float:
    """Plain accuracy in percent of hard predictions (no scores, so no ties to break)."""
    p, y = np.asarray(predictions), np.asarray(labels)
    if p.shape != y.shape:
        raise ValueError(f"accuracy: {p.shape} predictions vs {y.shape} labels")
    return 100.0 * float((p == y).mean())


def tied_maxima(scores: np.ndarray) -> np.ndarray:
    """[rows, choices] bool: the choices that share each row's best finite score (a row
    with no finite score has none)."""
    scores = np.asarray(scores, np.float64)
    if scores.ndim != 2 or scores.shape[1] == 0:
        raise ValueError(f"tied_maxima: expected scores [rows, choices], got {scores.shape}")
    finite = np.isfinite(scores)
    ranked = np.where(finite, scores, -np.inf)
    return finite & (ranked == ranked.max(1, keepdims=True))


def mean_over_best(best: np.ndarray, credit_sum: np.ndarray) -> np.ndarray:
    """Per row: ``credit_sum`` / the row's tied best choices; 0 for a row with none (no
    finite score)."""
    count = best.sum(1)
    return np.where(count > 0, credit_sum / np.maximum(count, 1), 0.0)


def expected_credit(scores: np.ndarray, credit: np.ndarray) -> np.ndarray:
    """Per row: the mean ``credit`` over the row's tied best choices, i.e. the expected
    credit when ties are broken uniformly at random (credit: 1/0 for right/wrong, or a soft
    score)."""
    best = tied_maxima(scores)
    credit = np.asarray(credit, np.float64)
    if credit.shape != best.shape:
        raise ValueError(f"expected_credit: credit {credit.shape} vs scores {best.shape}")
    return mean_over_best(best, (credit * best).sum(1))


def expected_hits(scores: np.ndarray, labels: Sequence[int]) -> np.ndarray:
    """Per row: the probability that a random-tie-break argmax of ``scores`` is ``labels``."""
    scores = np.asarray(scores)
    y = np.asarray(labels, np.int64)
    if scores.ndim != 2:
        raise ValueError(f"expected_hits: expected scores [rows, choices], got {scores.shape}")
    if y.shape != scores.shape[:1]:
        raise ValueError(f"expected_hits: {scores.shape[0]} score rows vs {y.shape} labels")
    # a label outside [0, classes) (-1: "none") would index from the end and credit the
    # last class
    bad = np.flatnonzero((y < 0) | (y >= scores.shape[1]))
    if len(bad):
        more = f" (and {len(bad) - 1} more rows)" if len(bad) > 1 else ""
        raise ValueError(f"expected_hits: label {int(y[bad[0]])} in row {int(bad[0])}{more} "
                         f"is not a class index 0..{scores.shape[1] - 1}")
    right = np.zeros(scores.shape, bool)
    right[np.arange(len(y)), y] = True
    return expected_credit(scores, right)


def expected_accuracy(scores: np.ndarray, labels: Sequence[int]) -> float:
    """Accuracy in percent of the argmax of ``scores`` [rows, classes], ties broken at
    random (their expected value)."""
    return 100.0 * float(expected_hits(scores, labels).mean())
