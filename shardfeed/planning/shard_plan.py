"""Shuffled shard planning over stable-hash micro-buckets: memory is bounded by the bucket count,
never by the sample count.

Every unit (a sample, or a whole episode) falls into one of ``FINE_BUCKETS`` buckets by its stable
shuffle key. Only per-bucket totals reach the planner, which cuts the buckets, in id order, into
contiguous ranges of equal bytes: a shard's deviation from the mean is at most one bucket, and a
shard is a range of the hash space, so a spool sorted by bucket holds each shard's rows as one run
(``formats/spool.py``). Where shards hold too few units for ranges to balance within 1%, buckets
are packed largest first onto the lightest shard (LPT) instead. Units larger than the target shard
are planned alone. Every choice breaks ties on stable keys, so the plan is identical on every
runner.
"""

from __future__ import annotations

import functools
import heapq
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from shardfeed.planning.partition import num_parts_for

FINE_BUCKETS = 1 << 20  # fixed, so a unit's bucket is known while scanning, before any total
BIG_BUCKET_BASE = 1 << 62  # bucket ids at or above this hold exactly one oversized unit
HOT_BUCKET_BASE = 1 << 61  # a hot unit's bucket: HOT_BUCKET_BASE + its fine bucket
#: bucket ranges are the plan when their fullest shard is within this of the mean; otherwise
#: (few units per shard) buckets are packed largest first onto the lightest shard (LPT)
RANGE_TOLERANCE = 1.01


@dataclass(frozen=True)
class BucketTotal:
    """Totals of one bucket: ``units`` (samples or episodes), ``rows`` and payload ``bytes``."""

    bucket: int
    units: int
    rows: int
    bytes: int

    def __add__(self, other: BucketTotal) -> BucketTotal:
        return BucketTotal(
            self.bucket, self.units + other.units, self.rows + other.rows, self.bytes + other.bytes
        )


@dataclass(frozen=True)
class ShardPlan:
    """Bucket → shard, and each shard's totals and first global row and unit index."""

    shard_of: dict[int, int]
    rows: tuple[int, ...]
    units: tuple[int, ...]
    bytes: tuple[int, ...]
    row_start: tuple[int, ...] = field(init=False)
    unit_start: tuple[int, ...] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "row_start", _prefix(self.rows))
        object.__setattr__(self, "unit_start", _prefix(self.units))

    @property
    def num_shards(self) -> int:
        return len(self.rows)

    def shards_of(self, buckets: np.ndarray) -> np.ndarray:
        """The shard of each bucket of a ``uint64`` array (every bucket must be planned)."""
        known, shards = self.bucket_arrays
        buckets = np.asarray(buckets, dtype=np.uint64)
        where = np.minimum(np.searchsorted(known, buckets), max(len(known) - 1, 0))
        if len(buckets) and (not len(known) or not np.array_equal(known[where], buckets)):
            missing = buckets[known[where] != buckets] if len(known) else buckets
            raise KeyError(f"bucket {int(missing[0])} is not in the plan")
        return shards[where]

    @functools.cached_property
    def bucket_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """The planned buckets (``uint64``, sorted) and their shards, as arrays."""
        known = np.fromiter(self.shard_of.keys(), dtype=np.uint64, count=len(self.shard_of))
        shards = np.fromiter(self.shard_of.values(), dtype=np.int64, count=len(self.shard_of))
        order = np.argsort(known, kind="stable")
        return known[order], shards[order]


def bucket_of(
    shuffle_key: int, unit_bytes: int, target_bytes: int, buckets: int = FINE_BUCKETS
) -> int:
    """A unit's bucket: its own big bucket when it exceeds the target, else by shuffle key."""
    if unit_bytes > target_bytes:
        return BIG_BUCKET_BASE + (shuffle_key % BIG_BUCKET_BASE)
    return shuffle_key % buckets


def buckets_of(keys: np.ndarray, sizes: np.ndarray, target_bytes: int) -> np.ndarray:
    """:func:`bucket_of` over arrays of shuffle keys (``uint64``) and unit sizes."""
    keys = np.asarray(keys, dtype=np.uint64)
    big = np.uint64(BIG_BUCKET_BASE) + keys % np.uint64(BIG_BUCKET_BASE)
    return np.where(np.asarray(sizes) > target_bytes, big, keys % np.uint64(FINE_BUCKETS))


def plan_shards(totals: Iterable[BucketTotal], target_bytes: int) -> ShardPlan:
    """Pack buckets into ``round(total / target)`` shards (big units each get their own).

    Partial totals of one bucket are summed first, so callers may pass per-file totals directly.
    """
    totals = list(totals)
    columns = np.array([(t.units, t.rows, t.bytes) for t in totals], dtype=np.int64).reshape(-1, 3)
    buckets = np.array([t.bucket for t in totals], dtype=np.uint64)
    return plan_bucket_arrays(buckets, *columns.T, target_bytes)


def plan_bucket_arrays(
    buckets: np.ndarray, units: np.ndarray, rows: np.ndarray, nbytes: np.ndarray, target: int
) -> ShardPlan:
    """:func:`plan_shards` over arrays of bucket totals (a bucket may repeat; its parts are
    summed): no object per bucket, so a million buckets plan in well under a second."""
    known, inverse = np.unique(np.asarray(buckets, dtype=np.uint64), return_inverse=True)
    sums = np.zeros((3, len(known)), dtype=np.int64)
    for row, values in zip(sums, (units, rows, nbytes), strict=True):
        np.add.at(row, inverse, np.asarray(values, dtype=np.int64))
    units, rows, nbytes = sums
    small = np.flatnonzero(known < np.uint64(BIG_BUCKET_BASE))
    big = np.flatnonzero(known >= np.uint64(BIG_BUCKET_BASE))  # sorted by bucket id
    n_small = min(num_parts_for(int(nbytes[small].sum()), target), len(small)) if len(small) else 0
    shard = np.empty(len(known), dtype=np.int64)
    # contiguous ranges of buckets in id order (the hash order): a bucket goes to the shard its
    # byte midpoint falls in, so each shard is within a bucket of the mean and holds a uniformly
    # random subset; a slot no midpoint falls in (a bucket larger than a slot) is dropped
    if n_small:
        raw = _raw_shards(0, nbytes[small], int(nbytes[small].sum()), n_small)
        used, ranges = np.unique(raw, return_inverse=True)
        loads = _exact_bincount(ranges, nbytes[small], len(used))
        if len(used) == n_small and loads.max() <= RANGE_TOLERANCE * loads.mean():
            shard[small] = ranges
        else:  # too few buckets per shard for ranges to balance: pack them (LPT)
            shard[small] = _lpt(known[small], nbytes[small], n_small)
    shard[big] = n_small + np.arange(len(big), dtype=np.int64)
    count = n_small + len(big)
    totals = [_exact_bincount(shard, values, count) for values in (rows, units, nbytes)]
    shard_of = dict(zip(known.tolist(), shard.tolist(), strict=True))
    return ShardPlan(shard_of, *(tuple(t.tolist()) for t in totals))


def _lpt(buckets: np.ndarray, nbytes: np.ndarray, n: int) -> np.ndarray:
    """Each bucket's shard when packed largest first onto the lightest of ``n`` shards (LPT);
    ties by bucket id and shard number."""
    order = np.lexsort((buckets, -nbytes))
    heap = [(0, k) for k in range(n)]
    chosen = []
    for size in nbytes[order].tolist():
        load, k = heap[0]
        chosen.append(k)
        heapq.heapreplace(heap, (load + size, k))
    shard = np.empty(len(buckets), dtype=np.int64)
    shard[order] = np.array(chosen, dtype=np.int64)
    return shard


def _exact_bincount(groups: np.ndarray, values: np.ndarray, n: int) -> np.ndarray:
    """Integer sums per group (``np.bincount`` weights are floats, inexact above 2**53)."""
    out = np.zeros(n, dtype=np.int64)
    np.add.at(out, groups, values)
    return out


def hot_bucket(bucket: int) -> int:
    """The bucket a unit moves to when it joins the hot set: fine buckets get their own id
    range, so hot and other units never share one; an oversized unit keeps its own bucket."""
    return bucket if bucket >= BIG_BUCKET_BASE else HOT_BUCKET_BASE + bucket


def hot_buckets(buckets: np.ndarray) -> np.ndarray:
    """:func:`hot_bucket` over a ``uint64`` array."""
    buckets = np.asarray(buckets, dtype=np.uint64)
    return np.where(
        buckets >= np.uint64(BIG_BUCKET_BASE), buckets, buckets + np.uint64(HOT_BUCKET_BASE)
    )


def plan_classes(
    hot: Iterable[BucketTotal], rest: Iterable[BucketTotal], target_bytes: int
) -> tuple[ShardPlan, int]:
    """Plan the hot units' buckets (ids from :func:`hot_bucket`) and the rest separately, hot
    shards first: each class is balanced on its own and no shard mixes the two. Returns the
    plan and the number of leading hot shards."""
    first, second = plan_shards(hot, target_bytes), plan_shards(rest, target_bytes)
    shift = first.num_shards
    shard_of = {**first.shard_of, **{b: s + shift for b, s in second.shard_of.items()}}
    plan = ShardPlan(
        shard_of, first.rows + second.rows, first.units + second.units, first.bytes + second.bytes
    )
    return plan, shift


def totals_from_arrays(
    buckets: np.ndarray, units: np.ndarray, rows: np.ndarray, nbytes: np.ndarray
) -> list[BucketTotal]:
    return [
        BucketTotal(int(b), int(u), int(r), int(s))
        for b, u, r, s in zip(buckets, units, rows, nbytes, strict=True)
    ]


def _prefix(values: tuple[int, ...]) -> tuple[int, ...]:
    out, running = [], 0
    for value in values:
        out.append(running)
        running += value
    return tuple(out)


@dataclass(frozen=True)
class ContiguousPlan:
    """Source order kept: the unit whose byte midpoint falls in ``[k, k+1) * total / N`` goes to
    raw shard ``k``, so each shard is within one unit of the mean; raw shards left empty (units
    larger than a shard) are dropped and the rest renumbered through ``compact``."""

    file_offsets: dict[str, int]
    total_bytes: int
    compact: tuple[int, ...]  # raw shard -> published shard number
    rows: tuple[int, ...]
    units: tuple[int, ...]
    bytes: tuple[int, ...]
    row_start: tuple[int, ...] = field(init=False)
    unit_start: tuple[int, ...] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "row_start", _prefix(self.rows))
        object.__setattr__(self, "unit_start", _prefix(self.units))

    @property
    def num_shards(self) -> int:
        return len(self.rows)

    def shards_of(self, file: str, sizes: np.ndarray) -> np.ndarray:
        """Published shard of each unit of ``file`` (its units' sizes in source order)."""
        raw = _raw_shards(self.file_offsets[file], sizes, self.total_bytes, len(self.compact))
        return np.asarray(self.compact)[raw]


def plan_contiguous(
    file_bytes: Sequence[tuple[str, int]],
    read_units: Callable[[str], tuple[np.ndarray, np.ndarray]],
    target_bytes: int,
) -> ContiguousPlan:
    """Plan over files in source order: ``file_bytes`` gives each file's payload total and
    ``read_units(file)`` its units' ``(sizes, rows)`` in order; memory is one file's units."""
    offsets: dict[str, int] = {}
    total = 0
    for name, size in file_bytes:
        offsets[name] = total
        total += int(size)
    n = num_parts_for(total, target_bytes)
    rows, units, nbytes = np.zeros(n, np.int64), np.zeros(n, np.int64), np.zeros(n, np.int64)
    for name, _ in file_bytes:
        sizes, unit_rows = read_units(name)
        raw = _raw_shards(offsets[name], sizes, total, n)
        np.add.at(rows, raw, unit_rows)
        np.add.at(units, raw, 1)
        np.add.at(nbytes, raw, sizes)
    kept = units > 0
    compact = np.cumsum(kept) - 1
    return ContiguousPlan(
        offsets,
        total,
        tuple(compact.tolist()),
        tuple(rows[kept].tolist()),
        tuple(units[kept].tolist()),
        tuple(nbytes[kept].tolist()),
    )


def _raw_shards(offset: int, sizes: np.ndarray, total: int, n: int) -> np.ndarray:
    sizes = np.asarray(sizes, dtype=np.int64)
    starts = offset + np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    mids = 2 * starts + sizes
    if 2 * max(total, 1) * n < 2**62:  # int64 arithmetic is exact
        raw = mids * n // max(1, 2 * total)
    else:  # petabyte totals times many shards: exact Python integers
        raw = np.array([int(m) * n // (2 * total) for m in mids.tolist()], dtype=np.int64)
    return np.minimum(n - 1, raw)
