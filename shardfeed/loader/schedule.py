"""The row-group reads of a loader pass, in the order its pieces need them.

Pure numpy, no I/O. A piece names a row group by ``(stream, shard, group)``; pieces
come in delivery order. Each piece is served by a *read*: one decode of its row group. A
decoded group is kept for the next piece that uses it when that piece is at most ``window``
pieces ahead (batch cuts split a group's rows into adjacent pieces, and a stored assignment,
a rank boundary or padding can bring a group back a little later), and dropped otherwise, to be
read again when needed: memory stays bounded and no group is decoded twice in a row. Knowing every read up front lets the loader keep a fixed number of
reads in flight and release each table right after its last piece.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ReadSchedule:
    """``read[p]``: the read serving piece ``p``; per read, its row group and its pieces' span."""

    read: np.ndarray  # int64, len P
    stream: np.ndarray  # int64, len R: the read's row group ...
    shard: np.ndarray
    group: np.ndarray
    first: np.ndarray  # int64, len R: the first and last piece the read serves
    last: np.ndarray

    @property
    def num_reads(self) -> int:
        return len(self.first)


def schedule_reads(
    stream: np.ndarray, shard: np.ndarray, group: np.ndarray, window: int
) -> ReadSchedule:
    """The reads serving pieces ``(stream, shard, group)`` taken in order (see module doc)."""
    if window < 0:
        raise ValueError(f"window must be >= 0, got {window}")
    stream, shard, group = (np.asarray(a, dtype=np.int64) for a in (stream, shard, group))
    n = len(shard)
    # each row group's uses, in delivery order; a use more than ``window`` pieces after the
    # previous one of its group (or a group's first use) starts a new read
    order = np.lexsort((np.arange(n), group, shard, stream))
    s, h, g = stream[order], shard[order], group[order]
    starts = np.ones(n, dtype=bool)
    starts[1:] = (s[1:] != s[:-1]) | (h[1:] != h[:-1]) | (g[1:] != g[:-1])
    starts[1:] |= np.diff(order) > window
    run = np.cumsum(starts) - 1  # the run of uses (one read) each sorted piece belongs to
    run_first = order[starts]
    run_last = order[np.r_[np.flatnonzero(starts)[1:] - 1, n - 1]] if n else order[:0]
    number = np.empty(len(run_first), dtype=np.int64)  # reads are numbered by first use
    by_first = np.argsort(run_first, kind="stable")
    number[by_first] = np.arange(len(run_first))
    read = np.empty(n, dtype=np.int64)
    read[order] = number[run]
    first = run_first[by_first]
    return ReadSchedule(
        read=read,
        stream=stream[first],
        shard=shard[first],
        group=group[first],
        first=first,
        last=run_last[by_first],
    )
