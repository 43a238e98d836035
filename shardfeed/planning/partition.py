"""Contiguous balanced partition: cut an ordered list of item sizes into parts of near-equal bytes."""

from __future__ import annotations

import numpy as np


def num_parts_for(total_bytes: int, target_bytes: int) -> int:
    """How many parts of about ``target_bytes`` a total needs (at least one)."""
    if target_bytes <= 0:
        raise ValueError(f"target size must be > 0, got {target_bytes}")
    return max(1, round(total_bytes / target_bytes))


def contiguous_cuts(sizes: np.ndarray, num_parts: int) -> list[int]:
    """Return boundaries ``[0, b1, ..., len(sizes)]`` splitting items, in order, into ``num_parts``.

    Each cut is placed at the item boundary nearest the ideal ``k * total / num_parts``, so a part
    deviates from the mean by at most one item. Items are never split (an item may be an episode).
    Empty parts are dropped, so fewer parts come back when there are fewer items than parts.
    """
    sizes = np.asarray(sizes, dtype=np.int64)
    n = len(sizes)
    if n == 0:
        return [0]
    if num_parts < 1:
        raise ValueError(f"num_parts must be >= 1, got {num_parts}")
    cum = np.concatenate([[0], np.cumsum(sizes)])
    total = int(cum[-1])
    ideal = np.arange(1, num_parts) * (total / num_parts)
    right = np.searchsorted(cum, ideal, side="left").clip(1, n)
    left = right - 1
    pick = np.where(np.abs(cum[left] - ideal) <= np.abs(cum[right] - ideal), left, right)
    cuts = sorted({0, n, *(int(p) for p in pick)})
    return cuts
