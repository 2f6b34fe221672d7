"""Plain accuracy in percent, the metric NLVR2 and SNLI-VE share (scores are percentages,
the unit of UNITER's Table 3)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def accuracy(predictions: Sequence, labels: Sequence) -> float:
    """Plain accuracy in percent (NLVR2, SNLI-VE)."""
    p, y = np.asarray(predictions), np.asarray(labels)
    if p.shape != y.shape:
        raise ValueError(f"accuracy: {p.shape} predictions vs {y.shape} labels")
    return 100.0 * float((p == y).mean())
