"""Row spans: ``(shard, start, end)`` ranges and the vectorised operations planners build on.

A plan never lists samples one by one: it lists spans, so its size grows with the number of
spans. A *sequence* of spans is read in order; positions in it are rows counted from its start.
Global coordinates number every row of the dataset: ``offsets[shard] + row``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Spans:
    """Parallel int64 arrays: rows ``[start, end)`` of ``shard``, in reading order."""

    shard: np.ndarray
    start: np.ndarray
    end: np.ndarray

    def __post_init__(self) -> None:
        for name in ("shard", "start", "end"):
            object.__setattr__(self, name, np.asarray(getattr(self, name), dtype=np.int64))
        if not len(self.shard) == len(self.start) == len(self.end):
            raise ValueError("shard, start and end must have equal lengths")

    def __len__(self) -> int:
        return len(self.shard)

    @property
    def rows(self) -> np.ndarray:
        return self.end - self.start

    @property
    def total_rows(self) -> int:
        return int(self.rows.sum())

    def take(self, index: np.ndarray) -> Spans:
        return Spans(self.shard[index], self.start[index], self.end[index])

    @classmethod
    def empty(cls) -> Spans:
        return cls(np.zeros(0), np.zeros(0), np.zeros(0))

    @classmethod
    def whole_shards(cls, rows_per_shard: np.ndarray) -> Spans:
        """Every row of every shard, in shard order."""
        rows = np.asarray(rows_per_shard, dtype=np.int64)
        return cls(np.arange(len(rows)), np.zeros(len(rows)), rows)

    def to_global(self, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Global ``[a, b)`` of each span; ``offsets[s]`` is shard ``s``'s first global row."""
        base = offsets[self.shard]
        return base + self.start, base + self.end


@dataclass(frozen=True)
class RowBytes:
    """Exact payload bytes of any span, from cumulative per-sample sizes (no payload reads)."""

    prefix: np.ndarray  # int64, len N + 1: bytes of global rows [0, i)
    offsets: np.ndarray  # int64, len S + 1: first global row of each shard, then N
    #: int64, len G + 1: first global row of each row group, then N (None: not known). Planners
    #: cut read units here, so one unit never makes a reader decode two groups.
    groups: np.ndarray | None = None

    @classmethod
    def from_sizes(
        cls,
        sizes: np.ndarray,
        rows_per_shard: np.ndarray,
        row_groups: Sequence[Sequence[int]] | None = None,
    ) -> RowBytes:
        """From every sample's payload bytes and each shard's rows; ``row_groups``: each
        shard's rows per row group (the manifest's ``shards[].row_groups``), when known."""
        prefix = np.zeros(len(sizes) + 1, dtype=np.int64)
        np.cumsum(sizes, out=prefix[1:])
        offsets = np.zeros(len(rows_per_shard) + 1, dtype=np.int64)
        np.cumsum(rows_per_shard, out=offsets[1:])
        if offsets[-1] != len(sizes):
            raise ValueError(f"{len(sizes)} sample sizes for shards holding {offsets[-1]} rows")
        groups = None
        if row_groups is not None:
            groups = row_group_starts(row_groups)
            if groups[-1] != len(sizes):
                raise ValueError(f"row groups hold {groups[-1]} rows, not {len(sizes)}")
        return cls(prefix, offsets, groups)

    @property
    def num_samples(self) -> int:
        return len(self.prefix) - 1

    @property
    def total(self) -> int:
        return int(self.prefix[-1])

    def of(self, spans: Spans) -> np.ndarray:
        a, b = spans.to_global(self.offsets)
        return self.prefix[b] - self.prefix[a]


def row_group_starts(row_groups: Sequence[Sequence[int]]) -> np.ndarray:
    """First global row of every row group, then N, from each shard's rows per row group (the
    manifest's ``shards[].row_groups``)."""
    rows = np.concatenate([np.asarray(g, dtype=np.int64) for g in row_groups] or [[]])
    starts = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(rows, out=starts[1:])
    return starts


def group_arange(counts: np.ndarray) -> np.ndarray:
    """``concat(arange(c) for c in counts)``, vectorised."""
    counts = np.asarray(counts, dtype=np.int64)
    total = int(counts.sum())
    firsts = np.cumsum(counts) - counts
    return np.arange(total, dtype=np.int64) - np.repeat(firsts, counts)


def sorted_unique(values: np.ndarray) -> np.ndarray:
    """``np.unique`` for int arrays made of a few sorted runs: a stable sort merges runs in
    linear time, where numpy 2's hash-based unique is several times slower."""
    values = np.sort(values, kind="stable")
    return values[np.r_[True, values[1:] != values[:-1]]] if len(values) else values


def refine(spans: Spans, cuts: np.ndarray) -> tuple[Spans, np.ndarray, np.ndarray]:
    """Cut a sequence of spans at sequence positions ``cuts`` (sorted, non-decreasing).

    Returns the pieces between ``cuts[0]`` and ``cuts[-1]`` in order, the part ``i`` each piece
    falls in (``cuts[i] <= position < cuts[i + 1]``) and the input span each came from. Rows
    outside ``[cuts[0], cuts[-1])`` are left out, so a cut list can also truncate.
    """
    cuts = np.asarray(cuts, dtype=np.int64)
    bounds = np.zeros(len(spans) + 1, dtype=np.int64)
    np.cumsum(spans.rows, out=bounds[1:])
    points = sorted_unique(np.concatenate([bounds, cuts]))
    points = points[(points >= cuts[0]) & (points <= cuts[-1])]
    first, last = points[:-1], points[1:]
    source = np.searchsorted(bounds, first, side="right") - 1
    part = np.searchsorted(cuts, first, side="right") - 1
    start = spans.start[source] + (first - bounds[source])
    return Spans(spans.shard[source], start, start + (last - first)), part, source


def split_rows(spans: Spans, size: int) -> tuple[Spans, np.ndarray]:
    """Cut each span into pieces of at most ``size`` rows, aligned to its start; returns the
    pieces and the input span each came from."""
    counts = -(-spans.rows // size)
    source = np.repeat(np.arange(len(spans)), counts)
    start = spans.start[source] + group_arange(counts) * size
    return Spans(spans.shard[source], start, np.minimum(start + size, spans.end[source])), source


def cut_at(spans: Spans, boundaries: np.ndarray, offsets: np.ndarray) -> tuple[Spans, np.ndarray]:
    """Cut each span at the global row positions ``boundaries`` (sorted) that fall inside it;
    returns the pieces, in order, and the input span each came from."""
    a, b = spans.to_global(offsets)
    boundaries = np.asarray(boundaries, dtype=np.int64)
    first = np.searchsorted(boundaries, a, side="right")  # the first boundary past a
    inner = np.maximum(np.searchsorted(boundaries, b, side="left") - first, 0)
    source = np.repeat(np.arange(len(spans)), inner + 1)
    k = group_arange(inner + 1)
    at = first[source] + k  # piece k runs from boundary at - 1 (or a) to boundary at (or b)
    start, end = a[source], b[source]
    opened, closed = k > 0, k < inner[source]
    start[opened] = boundaries[at[opened] - 1]
    end[closed] = boundaries[at[closed]]
    base = offsets[spans.shard[source]]
    return Spans(spans.shard[source], start - base, end - base), source


def row_group_runs(
    spans: Spans, part: np.ndarray, groups: np.ndarray, offsets: np.ndarray
) -> tuple[int, int]:
    """Each part's spans read in order (``part``: each span's sequence): how many runs of rows
    inside one row group they make (a reader decodes a group at most once per run), and how
    many distinct row groups they touch. ``groups``: first global row of each group, then N."""
    pieces, source = cut_at(spans, groups, offsets)
    keep = pieces.rows > 0
    if not keep.any():
        return 0, 0
    start, _ = pieces.take(keep).to_global(offsets)
    group = np.searchsorted(groups, start, side="right") - 1
    owner = np.asarray(part)[source[keep]]
    runs = np.r_[True, (group[1:] != group[:-1]) | (owner[1:] != owner[:-1])]
    return int(runs.sum()), len(sorted_unique(group))


def split_near(spans: Spans, size: int) -> tuple[Spans, np.ndarray]:
    """Cut each span into near-equal pieces of about ``size`` rows: ``round(rows / size)``
    pieces (at least one), so a span a little over ``size`` stays whole and no piece exceeds
    1.5 x ``size`` rows. Returns the pieces and the input span each came from."""
    counts = np.maximum((2 * spans.rows + size) // (2 * size), 1) * (spans.rows > 0)
    source = np.repeat(np.arange(len(spans)), counts)
    k, n = group_arange(counts), counts[source]
    rows, first = spans.rows[source], spans.start[source]
    return Spans(spans.shard[source], first + k * rows // n, first + (k + 1) * rows // n), source


def merge_adjacent(spans: Spans, group: np.ndarray) -> tuple[Spans, np.ndarray]:
    """Join each span to the previous one when both share ``group`` and shard and touch."""
    if len(spans) == 0:
        return spans, group
    joins = (
        (group[1:] == group[:-1])
        & (spans.shard[1:] == spans.shard[:-1])
        & (spans.start[1:] == spans.end[:-1])
    )
    heads = np.flatnonzero(np.r_[True, ~joins])
    tails = np.r_[heads[1:] - 1, len(spans) - 1]
    merged = Spans(spans.shard[heads], spans.start[heads], spans.end[tails])
    return merged, group[heads]


def union(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted, disjoint, non-touching cover of the global intervals ``[a, b)``."""
    keep = b > a
    a, b = a[keep], b[keep]
    if len(a) == 0:
        return a, b
    order = np.argsort(a, kind="stable")
    a, b = a[order], b[order]
    reach = np.maximum.accumulate(b)
    heads = np.flatnonzero(np.r_[True, a[1:] > reach[:-1]])
    tails = np.r_[heads[1:] - 1, len(a) - 1]
    return a[heads], reach[tails]


def subtract(
    a: np.ndarray, b: np.ndarray, c: np.ndarray, d: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Rows of the intervals ``[a, b)`` not in ``[c, d)``, as a sorted disjoint cover."""
    a, b = union(a, b)
    c, d = union(c, d)
    points = sorted_unique(np.concatenate([a, b, c, d]))
    if len(points) < 2:
        return points[:0], points[:0]
    lo, hi = points[:-1], points[1:]
    keep = _covered(lo, a, b) & ~_covered(lo, c, d)
    return union(lo[keep], hi[keep])


def _covered(points: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Whether each point lies in one of the sorted disjoint intervals ``[a, b)``."""
    if len(a) == 0:
        return np.zeros(len(points), dtype=bool)
    i = np.searchsorted(a, points, side="right") - 1
    return (i >= 0) & (points < b[np.maximum(i, 0)])


def from_global(a: np.ndarray, b: np.ndarray, offsets: np.ndarray) -> Spans:
    """Global intervals as spans, split at shard boundaries, in global order."""
    keep = b > a
    a, b = a[keep], b[keep]
    first = np.searchsorted(offsets, a, side="right") - 1
    last = np.searchsorted(offsets, b - 1, side="right") - 1
    counts = last - first + 1
    shard = np.repeat(first, counts) + group_arange(counts)
    lo = np.maximum(np.repeat(a, counts), offsets[shard]) - offsets[shard]
    hi = np.minimum(np.repeat(b, counts), offsets[shard + 1]) - offsets[shard]
    return Spans(shard, lo, hi)
