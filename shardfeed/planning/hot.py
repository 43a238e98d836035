"""Hot-sample planning: expected accesses per sample, the heat order, coverage, and what each
node pins in its cache.

Caching sample ``i`` saves ``accesses_i x bytes_i`` of shared-tier reads per epoch and costs
``bytes_i`` of cache, so the bytes saved per cached byte is ``accesses_i`` itself: filling a
cache in order of expected accesses per epoch (the *heat*) maximises the bytes it saves. Ties
go to the smaller sample (more of them fit), then to the lower index.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np


def accesses_from_weights(weights: np.ndarray, draws_per_epoch: int | None = None) -> np.ndarray:
    """Expected accesses per epoch under sampling with replacement: ``draws * w_i / sum(w)``.

    ``draws_per_epoch`` defaults to the number of samples (an epoch draws as many samples as
    the dataset holds). Weights must be finite and >= 0, with a positive sum."""
    weights = np.asarray(weights, dtype=np.float64)
    if weights.size and (not np.all(np.isfinite(weights)) or weights.min() < 0):
        raise ValueError("weights must be finite and >= 0")
    total = float(weights.sum())
    if total <= 0:
        raise ValueError("weights sum to 0: no sample would ever be drawn")
    draws = len(weights) if draws_per_epoch is None else draws_per_epoch
    return weights * (draws / total)


def accesses_from_log(ids: np.ndarray, num_samples: int, epochs: float = 1.0) -> np.ndarray:
    """Expected accesses per epoch from an access log of global sample indices covering
    ``epochs`` epochs; ids outside ``0..num_samples-1`` are refused."""
    ids = np.asarray(ids, dtype=np.int64)
    if ids.size and (ids.min() < 0 or ids.max() >= num_samples):
        bad = ids[(ids < 0) | (ids >= num_samples)][0]
        raise ValueError(f"access log id {bad} is outside 0..{num_samples - 1}")
    if epochs <= 0:
        raise ValueError(f"epochs must be > 0, got {epochs}")
    return np.bincount(ids, minlength=num_samples) / float(epochs)


def mixture_weights(source: np.ndarray, mixture: Mapping[str, float]) -> np.ndarray:
    """Per-sample weights from a per-source mixture: source ``s`` gets share ``w_s`` of the
    draws, spread evenly over its ``n_s`` samples (``w_s / n_s`` each). Sources missing from
    ``mixture`` get weight 0; a mixture source with no sample is an error."""
    source = np.asarray(source, dtype=object)
    names, codes = np.unique(source.astype(str), return_inverse=True)
    counts = np.bincount(codes, minlength=len(names))
    missing = sorted(set(mixture) - set(names.tolist()))
    if missing:
        raise ValueError(f"mixture names sources with no sample: {missing[:5]}")
    per_source = np.array([float(mixture.get(name, 0.0)) for name in names.tolist()])
    if np.any(per_source < 0) or not np.all(np.isfinite(per_source)):
        raise ValueError("mixture weights must be finite and >= 0")
    return per_source[codes] / counts[codes]


def heat_order(accesses: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """Sample indices by heat: expected accesses descending, then smaller first, then index."""
    index = np.arange(len(accesses))
    return np.lexsort((index, np.asarray(sizes), -np.asarray(accesses, dtype=np.float64)))


def coverage_curve(
    accesses: np.ndarray, sizes: np.ndarray, order: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Cache bytes against the share of expected accessed bytes they serve, along ``order``:
    ``(cum_bytes, cum_share)``, both of length ``len(order) + 1`` starting at 0."""
    sizes = np.asarray(sizes, dtype=np.float64)[order]
    served = np.asarray(accesses, dtype=np.float64)[order] * sizes
    total = served.sum()
    cum_bytes = np.concatenate([[0.0], np.cumsum(sizes)])
    cum_served = np.concatenate([[0.0], np.cumsum(served)])
    return cum_bytes, cum_served / total if total > 0 else cum_served


def fill(order: np.ndarray, sizes: np.ndarray, budget: int) -> np.ndarray:
    """The samples a cache of ``budget`` bytes pins: walk ``order`` and keep each sample that
    still fits (first fit, so one large sample never blocks the smaller ones behind it)."""
    sizes = np.asarray(sizes, dtype=np.int64)[order]
    cum = np.cumsum(sizes)
    head = int(np.searchsorted(cum, budget, side="right"))  # the prefix that fits outright
    kept = [order[:head]]
    room = budget - (int(cum[head - 1]) if head else 0)
    if head < len(order) and room > 0:
        rest = sizes[head:]
        small = np.flatnonzero(rest <= room)  # only these can still fit; walk them in order
        taken = []
        for i in small.tolist():
            if rest[i] <= room:
                taken.append(i)
                room -= int(rest[i])
                if room < int(rest[small].min(initial=room + 1)):
                    break
        kept.append(order[head:][np.asarray(taken, dtype=np.int64)])
    return np.concatenate(kept).astype(np.int64)


def node_pins(
    accesses: np.ndarray,
    sizes: np.ndarray,
    budget: int,
    node_of_sample: np.ndarray | None = None,
    nodes: int = 1,
) -> list[np.ndarray]:
    """Per node, the samples it pins within ``budget`` bytes, hottest first.

    Without ``node_of_sample`` every node may read any sample, so every node pins the same
    global hot set. With it (from an assignment: the node that reads each sample), a node pins
    the hottest of its own samples; samples no node reads (``-1``) are never pinned."""
    order = heat_order(accesses, sizes)
    order = order[np.asarray(accesses)[order] > 0]
    if node_of_sample is None:
        pinned = fill(order, sizes, budget)
        return [pinned for _ in range(nodes)]
    owner = np.asarray(node_of_sample)[order]
    return [fill(order[owner == n], sizes, budget) for n in range(nodes)]
