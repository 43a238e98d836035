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

    Items are never split (an item may be a whole episode). Two cut sets are computed and the one
    with the lower max/mean is kept:
    - nearest: each cut at the item boundary nearest ``k * total / num_parts``, so every part is
      within one item of the mean; best when items are small;
    - min-max: the smallest cap ``C`` such that greedy packing fits in ``num_parts`` parts
      (binary search), best when items are large relative to a part.
    Exactly ``min(num_parts, len(sizes))`` non-empty parts come back.
    Cost is O(num_parts * log(n) * log(total)) after one cumulative sum; no per-item Python loop.
    """
    sizes = np.asarray(sizes, dtype=np.int64)
    n = len(sizes)
    if n == 0:
        return [0]
    if num_parts < 1:
        raise ValueError(f"num_parts must be >= 1, got {num_parts}")
    cum = np.concatenate([[0], np.cumsum(sizes)])
    candidates = [_nearest_cuts(cum, num_parts), _min_max_cuts(cum, num_parts)]
    return min(candidates, key=lambda cuts: _imbalance(cum, cuts))


def _nearest_cuts(cum: np.ndarray, num_parts: int) -> list[int]:
    n = len(cum) - 1
    ideal = np.arange(1, num_parts) * (cum[-1] / num_parts)
    right = np.searchsorted(cum, ideal, side="left").clip(1, n)
    left = right - 1
    pick = np.where(np.abs(cum[left] - ideal) <= np.abs(cum[right] - ideal), left, right)
    return sorted({0, n, *(int(p) for p in pick)})


def _greedy(cum: np.ndarray, cap: int, limit: int) -> list[int] | None:
    """Pack items left to right into parts of at most ``cap``; None if more than ``limit`` parts."""
    n = len(cum) - 1
    cuts, start = [0], 0
    while start < n:
        end = int(np.searchsorted(cum, cum[start] + cap, side="right")) - 1
        end = max(end, start + 1)  # an item larger than the cap gets a part of its own
        cuts.append(end)
        start = end
        if len(cuts) - 1 > limit:
            return None
    return cuts


def _min_max_cuts(cum: np.ndarray, num_parts: int) -> list[int]:
    sizes = np.diff(cum)
    lo, hi = max(int(sizes.max()), int(np.ceil(cum[-1] / num_parts))), int(cum[-1])
    while lo < hi:
        mid = (lo + hi) // 2
        if _greedy(cum, mid, num_parts) is None:
            lo = mid + 1
        else:
            hi = mid
    n, parts = len(cum) - 1, min(num_parts, len(cum) - 1)
    forward = _greedy(cum, lo, num_parts) or [0, n]
    # packing from the right too: left to right alone can leave a sliver as the last part
    mirrored = _greedy(cum[-1] - cum[::-1], lo, num_parts) or [0, n]
    backward = [n - c for c in reversed(mirrored)]
    candidates = [_split_to(cum, cuts, parts) for cuts in (forward, backward)]
    return min(candidates, key=lambda cuts: _imbalance(cum, cuts))


def _split_to(cum: np.ndarray, cuts: list[int], num_parts: int) -> list[int]:
    """Split the largest multi-item parts at their middle boundary until there are ``num_parts``.

    Splitting never raises the largest part, so the min-max optimum is kept.
    """
    cuts = list(cuts)
    while len(cuts) - 1 < num_parts:
        bounds = np.asarray(cuts)
        sizes = np.diff(cum[bounds])
        splittable = np.diff(bounds) > 1
        k = int(np.argmax(np.where(splittable, sizes, -1)))
        a, b = cuts[k], cuts[k + 1]
        middle = int(np.searchsorted(cum, (cum[a] + cum[b]) / 2))
        cuts.insert(k + 1, min(max(middle, a + 1), b - 1))
    return cuts


def _imbalance(cum: np.ndarray, cuts: list[int]) -> tuple[int, int]:
    """Rank cut sets: the largest part first, then the spread between largest and smallest."""
    parts = np.diff(cum[cuts])
    return (int(parts.max()), int(parts.max() - parts.min()))
