"""The row-group reads of a loader pass, in the order its pieces need them.

Pure numpy and Python, no I/O. A piece names a row group by ``(stream, shard, group)``; pieces
come in delivery order. Each piece is served by a *read*: one decode of its row group. A
decoded group is kept for the next piece that uses it when that piece is at most ``window``
pieces ahead (blocks need not align with row groups, so one group often feeds two nearby
pieces), and dropped otherwise, to be read again when needed: memory stays bounded and no group
is decoded twice in a row. Knowing every read up front lets the loader keep a fixed number of
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
    n = len(shard)
    read = np.empty(n, dtype=np.int64)
    first: list[int] = []
    last: list[int] = []
    held: dict[tuple[int, int, int], int] = {}  # row group -> the read whose table is kept
    upcoming = _next_use(stream, shard, group).tolist()
    keys = list(zip(stream.tolist(), shard.tolist(), group.tolist(), strict=True))
    for p, key in enumerate(keys):
        r = held.pop(key, None)
        if r is None:
            r = len(first)
            first.append(p)
            last.append(p)
        read[p] = r
        last[r] = p
        if upcoming[p] - p <= window:
            held[key] = r
    first_arr = np.asarray(first, dtype=np.int64)
    return ReadSchedule(
        read=read,
        stream=np.asarray(stream, dtype=np.int64)[first_arr],
        shard=np.asarray(shard, dtype=np.int64)[first_arr],
        group=np.asarray(group, dtype=np.int64)[first_arr],
        first=first_arr,
        last=np.asarray(last, dtype=np.int64),
    )


def _next_use(stream: np.ndarray, shard: np.ndarray, group: np.ndarray) -> np.ndarray:
    """For each piece, the position of the next piece of the same row group (none: ``len``)."""
    n = len(shard)
    order = np.lexsort((np.arange(n), group, shard, stream))
    s, h, g = stream[order], shard[order], group[order]
    same = (s[1:] == s[:-1]) & (h[1:] == h[:-1]) & (g[1:] == g[:-1])
    out = np.full(n, n, dtype=np.int64)
    out[order[:-1][same]] = order[1:][same]
    return out
