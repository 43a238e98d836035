"""Deterministic weighted interleaving of several batch streams (pure numpy).

Each step goes to the source with the most credit, after every source earned its weight; the
chosen one then pays one step. This low-discrepancy rule keeps every prefix within one step of
its share, so over ANY window of ``n`` consecutive steps a source with weight ``w`` gets between
``n*w - 2`` and ``n*w + 2`` steps (``tests/test_loader_mixture.py`` checks it). Ties go to the
lower index, so every rank derives the same order from the same inputs.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

#: the bound on |steps(window) - n * weight| for any window of n consecutive steps
WINDOW_DEVIATION = 2


def normalize(weights: Sequence[float]) -> np.ndarray:
    """Weights as shares summing to 1; refuses negatives, NaN and an all-zero list."""
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim != 1 or len(w) == 0:
        raise ValueError("a mixture needs at least one weight")
    if not np.isfinite(w).all() or (w < 0).any() or w.sum() <= 0:
        raise ValueError(f"mixture weights must be finite, >= 0 and not all 0, got {list(w)}")
    return w / w.sum()


def interleave(weights: Sequence[float], available: Sequence[int]) -> np.ndarray:
    """Source index of every step, until some source with weight > 0 has no batch left.

    ``available[i]`` is how many batches source ``i`` holds. The schedule stops at the first
    step whose chosen source is exhausted, so no source is ever over-drawn and the weights hold
    up to the end.
    """
    shares = normalize(weights)
    left = np.asarray(available, dtype=np.int64).copy()
    if len(left) != len(shares):
        raise ValueError(f"{len(shares)} weights for {len(left)} sources")
    credit = np.zeros(len(shares))
    out: list[int] = []
    while True:
        credit += shares
        pick = int(np.argmax(credit))  # first maximum: ties go to the lower index
        if left[pick] == 0:
            break
        left[pick] -= 1
        credit[pick] -= 1.0
        out.append(pick)
    return np.asarray(out, dtype=np.int64)
