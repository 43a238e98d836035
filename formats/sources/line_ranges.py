"""Byte ranges of a line-oriented file, so one large file can be several scan tasks.

As Beam's ``textio`` splits text: a range owns every line that *starts* inside it, so the raw
cut points move forward to just past the next newline. Range ``k`` then ends exactly where range
``k + 1`` begins, the ranges tile the file, and each line is read by exactly one task, whatever
the cut points.
"""

from __future__ import annotations

from typing import Any

_SEEK_CHUNK = 64 << 10  # bytes read at a time while looking for the next newline


def byte_ranges(size: int, piece_bytes: int) -> list[tuple[int, int]]:
    """Cut ``size`` bytes into about ``ceil(size / piece_bytes)`` equal ranges ``[start, stop)``
    (the last one's ``stop`` is -1: to the end); one range ``(0, -1)`` when it fits."""
    if piece_bytes < 1:
        raise ValueError(f"piece_bytes must be positive, got {piece_bytes}")
    count = max(1, -(-size // piece_bytes))
    cuts = [size * k // count for k in range(count + 1)]
    return [(cuts[k], cuts[k + 1] if k + 1 < count else -1) for k in range(count)]


def line_start_at_or_after(handle: Any, position: int, size: int) -> int:
    """The offset of the first line starting at or after ``position``: ``position`` itself when
    the byte before it is a newline (or it is 0), else just past the next newline (``size`` when
    there is none)."""
    if position <= 0:
        return 0
    at = position - 1
    while at < size:
        chunk = handle.read_at(min(_SEEK_CHUNK, size - at), at)
        if not chunk:
            break
        found = chunk.find(b"\n")
        if found >= 0:
            return at + found + 1
        at += len(chunk)
    return size


class LineRangeReader:
    """A stream over the lines that start in ``[start, stop)`` of a random-access file
    (``read_at``/``size``), counting the newlines it hands out."""

    def __init__(self, handle: Any, start: int, stop: int) -> None:
        size = handle.size()
        self.start = line_start_at_or_after(handle, start, size)
        self.end = size if stop < 0 else max(self.start, line_start_at_or_after(handle, stop, size))
        self._handle, self._at = handle, self.start
        self.newlines = 0

    @property
    def exhausted(self) -> bool:
        return self._at >= self.end

    def read(self, n: int = -1) -> bytes:
        left = self.end - self._at
        want = left if n < 0 else min(n, left)
        if want <= 0:
            return b""
        data = self._handle.read_at(want, self._at)
        self._at += len(data)
        self.newlines += data.count(b"\n")
        return data

    def lines(self) -> int:
        """The number of lines that start in the range: read to its end first, so a caller that
        stopped early still gets the full count. A last line without a newline counts too."""
        while not self.exhausted:
            if not self.read(1 << 20):
                break
        if self.end <= self.start:
            return 0
        last = self._handle.read_at(1, self.end - 1)
        return self.newlines + (last != b"\n")
