"""A worker's read plan: its spans cut into pieces inside one row group, grouped into batches.

Pure numpy, no I/O. A piece is rows ``[lo, hi)`` of row group ``group`` of ``shard``; batch ``k``
is pieces ``batch_starts[k]:batch_starts[k + 1]``, in stream order. The loader reads each piece's
whole row group (the unit Parquet decodes; ``schedule.py`` says when) and slices it, so reads
are never row by row.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from shardfeed.planning.spans import RowBytes, Spans, group_arange, row_group_starts


@dataclass(frozen=True)
class GroupIndex:
    """Every row group of a dataset in global row coordinates."""

    starts: np.ndarray  # int64, len G + 1: first global row of each group, then N
    shard: np.ndarray  # int64, len G: the group's shard
    local: np.ndarray  # int64, len G: the group's position within its shard

    @classmethod
    def of(cls, row_groups: Sequence[Sequence[int]]) -> GroupIndex:
        """From each shard's row-group row counts (the manifest's ``shards[].row_groups``)."""
        counts = np.array([len(g) for g in row_groups], dtype=np.int64)
        return cls(
            starts=row_group_starts(row_groups),
            shard=np.repeat(np.arange(len(counts), dtype=np.int64), counts),
            local=group_arange(counts),
        )


@dataclass(frozen=True)
class ReadPlan:
    """Pieces in stream order and where each batch starts among them."""

    shard: np.ndarray
    group: np.ndarray  # within the shard
    lo: np.ndarray  # rows within the row group
    hi: np.ndarray
    payload: np.ndarray  # exact payload bytes of each piece
    batch_starts: np.ndarray  # len batches + 1

    @property
    def num_batches(self) -> int:
        return len(self.batch_starts) - 1

    @property
    def num_rows(self) -> int:
        return int((self.hi - self.lo).sum())

    def batch(self, k: int) -> range:
        """Piece positions of batch ``k``."""
        return range(int(self.batch_starts[k]), int(self.batch_starts[k + 1]))

    def batch_rows(self, k: int) -> int:
        part = self.batch(k)
        return int((self.hi[part.start : part.stop] - self.lo[part.start : part.stop]).sum())

    def batch_payload(self, k: int) -> int:
        part = self.batch(k)
        return int(self.payload[part.start : part.stop].sum())


def plan_reads(spans: Spans, groups: GroupIndex, row_bytes: RowBytes, batch_size: int) -> ReadPlan:
    """Cut ``spans`` (read in order) at row-group boundaries and every ``batch_size`` rows.

    The last batch holds the remainder when the stream is not a whole number of batches.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    a, b = spans.to_global(row_bytes.offsets)
    keep = b > a
    a, b = a[keep], b[keep]
    first = np.searchsorted(groups.starts, a, side="right") - 1
    last = np.searchsorted(groups.starts, b - 1, side="right") - 1
    counts = last - first + 1
    g = np.repeat(first, counts) + group_arange(counts)
    lo = np.maximum(np.repeat(a, counts), groups.starts[g])
    hi = np.minimum(np.repeat(b, counts), groups.starts[g + 1])
    # batch cuts: split the pieces that straddle a multiple of batch_size
    bounds = np.zeros(len(lo) + 1, dtype=np.int64)
    np.cumsum(hi - lo, out=bounds[1:])
    total = int(bounds[-1])
    cuts = np.arange(0, total, batch_size, dtype=np.int64)
    points = np.union1d(bounds, cuts)
    begin, end = points[:-1], points[1:]
    source = np.searchsorted(bounds, begin, side="right") - 1
    glo = lo[source] + (begin - bounds[source])  # global rows of each final piece
    ghi = glo + (end - begin)
    gg = g[source]
    base = groups.starts[gg]
    return ReadPlan(
        shard=groups.shard[gg],
        group=groups.local[gg],
        lo=glo - base,
        hi=ghi - base,
        payload=row_bytes.prefix[ghi] - row_bytes.prefix[glo],
        batch_starts=np.append(np.searchsorted(begin, cuts), len(begin)).astype(np.int64),
    )
