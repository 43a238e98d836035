"""Size-aware batches: cut every loader stream into batches under a cost budget, with the same
number of steps on every rank.

A *stream* is what one loader worker of one rank reads in an epoch, in order: the costs of its
samples (``streams[rank][worker]``, e.g. tokens or pixels from ``samples.parquet``). A batch is a
run of consecutive samples of one stream: a DataLoader worker builds its own batches, and keeping
the assignment's reading order keeps its reads sequential. A batch's cost is the sum of its
samples' costs. Two steps:

1. **Pack.** Next-fit over each stream: a batch takes the next sample while its total stays
   within ``max_cost``. For consecutive batches this is optimal (no cut of the stream under the
   budget has fewer batches). It is vectorised with one prefix sum and one ``searchsorted``: the
   batch starting at sample ``i`` ends before the first ``j`` with ``prefix[j] - prefix[i] >
   max_cost``; walking those ends visits each batch once.
2. **Equalise.** DDP steps ranks in lockstep, so every rank needs the same number of batches per
   epoch (summed over its workers). The target is the largest packed count over ranks. A rank
   below it repeatedly splits its costliest multi-sample batch (ties: more samples, then lower
   worker, then earlier) at the sample that best halves its cost. A split never raises a batch's
   cost, so the budget still holds, and the largest batches shrink first, which keeps per-step
   work even. A rank can have at most one batch per sample; if it holds fewer samples than the
   target (streams of unequal length), :class:`BatchingError` says so.

A sample costlier than ``max_cost`` on its own is an :class:`OversizeError` (``oversize="error"``,
the default), naming it; with ``oversize="alone"`` it forms a batch by itself, the only kind of
batch that may exceed the budget. Pure numpy, deterministic, no I/O.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = [
    "OVERSIZE",
    "BatchPlan",
    "BatchingError",
    "OversizeError",
    "equalise",
    "pack",
    "plan_batches",
]

#: what to do with a sample whose own cost exceeds the budget
OVERSIZE = ("error", "alone")


class BatchingError(ValueError):
    """The streams cannot be batched as asked."""


class OversizeError(BatchingError):
    """One sample costs more than the whole budget (``oversize="error"``)."""

    def __init__(
        self,
        rank: int,
        worker: int,
        position: int,
        cost: int,
        max_cost: int,
        sample: int | None = None,
    ) -> None:
        self.rank, self.worker, self.position, self.cost = rank, worker, position, cost
        self.max_cost, self.sample = max_cost, sample
        what = (
            f"sample {sample} (stream position {position})"
            if sample is not None
            else (f"the sample at stream position {position}")
        )
        super().__init__(
            f"rank {rank}, worker {worker}: {what} costs {cost}, more than "
            f"max_cost={max_cost}; raise max_cost or pass oversize='alone'"
        )


@dataclass(frozen=True)
class BatchPlan:
    """Batch boundaries per stream: ``bounds[rank][worker]`` is int64, ``0 = b[0] < ... <
    b[-1] = len(stream)``, and batch ``i`` is stream positions ``[b[i], b[i + 1])``. Every rank in
    ``bounds`` has exactly ``steps`` batches over its workers."""

    max_cost: int
    steps: int
    bounds: Mapping[int, tuple[np.ndarray, ...]]


def plan_batches(
    streams: Sequence[Sequence[np.ndarray]],
    max_cost: int,
    *,
    oversize: str = "error",
    ranks: Iterable[int] | None = None,
) -> BatchPlan:
    """Pack every stream (``streams[rank][worker]``: costs, >= 0, in reading order) under
    ``max_cost``, then equalise the ranks in ``ranks`` (default all) to the same step count.

    Every rank's packed count sets the target, so pass all ranks' streams even when only one
    rank's batches are wanted."""
    _check(max_cost, oversize)
    costs = [[_costs(c) for c in workers] for workers in streams]
    packed = [
        tuple(pack(c, max_cost, oversize=oversize, where=(r, w)) for w, c in enumerate(workers))
        for r, workers in enumerate(costs)
    ]
    steps = max((_count(b) for b in packed), default=0)
    chosen = range(len(streams)) if ranks is None else sorted(set(ranks))
    bounds = {}
    for rank in chosen:
        if not 0 <= rank < len(streams):
            raise BatchingError(f"rank {rank} is outside the {len(streams)} streams' ranks")
        bounds[rank] = equalise(costs[rank], packed[rank], steps, rank=rank)
    return BatchPlan(int(max_cost), steps, bounds)


def pack(
    costs: np.ndarray, max_cost: int, *, oversize: str = "error", where: tuple[int, int] = (0, 0)
) -> np.ndarray:
    """Next-fit batch boundaries of one stream under ``max_cost`` (see the module docstring);
    ``where`` is the stream's ``(rank, worker)``, for error messages."""
    _check(max_cost, oversize)
    costs = _costs(costs)
    n = len(costs)
    prefix = _prefix(costs)
    ends = np.searchsorted(prefix, prefix[:-1] + max_cost, side="right") - 1
    over = np.flatnonzero(ends == np.arange(n))  # a sample that alone exceeds the budget
    if over.size:
        if oversize == "error":
            i = int(over[0])
            raise OversizeError(where[0], where[1], i, int(costs[i]), int(max_cost))
        ends[over] = over + 1
    bounds = [0]
    nxt = ends.tolist()
    i = 0
    while i < n:
        i = nxt[i]
        bounds.append(i)
    return np.asarray(bounds, dtype=np.int64)


def equalise(
    costs: Sequence[np.ndarray], bounds: Sequence[np.ndarray], steps: int, *, rank: int = 0
) -> tuple[np.ndarray, ...]:
    """Split one rank's batches (``bounds[worker]`` over ``costs[worker]``) until they number
    ``steps`` in all, costliest multi-sample batch first, each at the sample that best halves
    its cost (see the module docstring)."""
    have = _count(bounds)
    samples = sum(len(c) for c in costs)
    if have > steps:
        raise BatchingError(f"rank {rank} already has {have} batches, more than {steps}")
    if steps > samples:
        raise BatchingError(
            f"rank {rank} reads {samples} samples, too few for {steps} batches (every rank needs "
            "the same number of steps; give the ranks equal sample counts)"
        )
    if have == steps:
        return tuple(np.asarray(b, dtype=np.int64) for b in bounds)
    prefixes = [_prefix(_costs(c)) for c in costs]
    heap = []  # (-cost, -rows, worker, start, end): the costliest multi-sample batch pops first
    for worker, b in enumerate(bounds):
        for a, e in zip(b[:-1].tolist(), b[1:].tolist(), strict=True):
            if e - a > 1:
                heap.append(_entry(prefixes[worker], worker, a, e))
    heapq.heapify(heap)
    cuts: list[list[int]] = [[] for _ in bounds]
    for _ in range(steps - have):
        _, _, worker, a, e = heapq.heappop(heap)
        cut = _halving_cut(prefixes[worker], a, e)
        cuts[worker].append(cut)
        for lo, hi in ((a, cut), (cut, e)):
            if hi - lo > 1:
                heapq.heappush(heap, _entry(prefixes[worker], worker, lo, hi))
    return tuple(
        np.union1d(np.asarray(b, dtype=np.int64), np.asarray(c, dtype=np.int64))
        for b, c in zip(bounds, cuts, strict=True)
    )


def _entry(prefix: np.ndarray, worker: int, a: int, e: int) -> tuple[int, int, int, int, int]:
    return (-int(prefix[e] - prefix[a]), -(e - a), worker, a, e)


def _halving_cut(prefix: np.ndarray, a: int, e: int) -> int:
    """The cut ``c`` in ``(a, e)`` whose left part's cost is nearest half of ``[a, e)``'s (the
    earlier on a tie); both parts keep at least one sample."""
    twice_half = int(prefix[a]) + int(prefix[e])  # compare 2 * prefix[c] with it: exact ints
    c = int(np.searchsorted(prefix[a + 1 : e], (twice_half + 1) // 2, side="left")) + a + 1
    candidates = [x for x in (c - 1, c) if a < x < e]
    return min(candidates, key=lambda x: (abs(2 * int(prefix[x]) - twice_half), x))


def _count(bounds: Sequence[np.ndarray]) -> int:
    """Batches in one rank's per-worker bounds."""
    return sum(len(b) - 1 for b in bounds)


def _prefix(costs: np.ndarray) -> np.ndarray:
    prefix = np.zeros(len(costs) + 1, dtype=np.int64)
    np.cumsum(costs, out=prefix[1:])
    return prefix


def _costs(costs: np.ndarray) -> np.ndarray:
    values = np.asarray(costs).reshape(-1)
    if values.size and values.min() < 0:
        raise BatchingError("sample costs must be >= 0")
    return values.astype(np.int64, copy=False)


def _check(max_cost: int, oversize: str) -> None:
    if oversize not in OVERSIZE:
        raise ValueError(f"oversize must be one of {OVERSIZE}, got {oversize!r}")
    if int(max_cost) != max_cost or max_cost < 1:
        raise ValueError(f"max_cost must be a positive integer, got {max_cost!r}")
