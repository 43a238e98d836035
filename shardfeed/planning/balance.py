"""Balance metrics shared by the shard planner, the rank assigner and ``inspect``."""

from __future__ import annotations

from collections.abc import Sequence


def max_over_mean(values: Sequence[int | float]) -> float:
    """max/mean of non-negative sizes; 1.0 is perfect balance, and an empty or all-zero list is 1.0."""
    if not values:
        return 1.0
    mean = sum(values) / len(values)
    return max(values) / mean if mean > 0 else 1.0
