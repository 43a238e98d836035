"""Seeded random keys that never change across numpy versions or platforms.

numpy's ``Generator`` methods may change their streams between releases (NEP 19), so plans that
must be byte-identical forever draw their randomness here: splitmix64 over integer words,
vectorised. A permutation is the argsort of such keys.
"""

from __future__ import annotations

import numpy as np

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: a bijection of uint64 with good avalanche."""
    x = x ^ (x >> np.uint64(30))
    x = x * _M1
    x = x ^ (x >> np.uint64(27))
    x = x * _M2
    return x ^ (x >> np.uint64(31))


def random_keys(seed: tuple[int, ...], *ids: np.ndarray | int) -> np.ndarray:
    """One uint64 key per element of the broadcast ``ids``, a pure function of ``seed`` and ids."""
    with np.errstate(over="ignore"):
        state = np.uint64(0)
        for word in seed:
            state = _mix(np.asarray(state ^ np.uint64(word & 0xFFFFFFFFFFFFFFFF)) + _GOLDEN)
        out = np.broadcast_to(state, np.broadcast_shapes(*(np.shape(i) for i in ids)))
        for values in ids:
            words = np.asarray(values).astype(np.int64).view(np.uint64)
            out = _mix((out ^ words) + _GOLDEN)
        return np.array(out, dtype=np.uint64)


def permutation(n: int, seed: tuple[int, ...]) -> np.ndarray:
    """A seeded permutation of ``range(n)`` (int64)."""
    return np.argsort(random_keys(seed, np.arange(n)), kind="stable")
