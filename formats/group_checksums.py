"""Row-group checksums: one CRC32C per row group's bytes, kept in the Parquet footer.

Parquet's own page checksums are CRC-32 computed in software by Arrow: checking them was over a
third of the loader's CPU time (``docs/BENCHMARKS.md``). shardfeed therefore records, while a
shard is written, the CRC32C (hardware-accelerated, about 10 GB/s here) of every row group's byte
range, in the footer's key-value metadata under :data:`KEY`. The check runs without the GIL: the
``crc32c`` package releases it for any buffer when asked (``google-crc32c`` releases it only for
``bytes``, so checking a memory-mapped range held every other loader thread). A reader of a
local shard checks the range before it decodes the group and leaves page checksums off; the range
covers page headers as well as page data, so it checks more than page checksums do. Page
checksums are still written, so any Parquet reader can check them, and shards without the key
(written before it existed) are read with page checksums checked, as before.

The value is JSON, ``{"ends": [e0, e1, ...], "crc32c": [c0, c1, ...]}``: row group ``g`` was
written as the bytes ``[e(g-1), e(g))`` of the file (``e(-1) = 0``, so the first range includes
the leading magic) and ``c(g)`` is their CRC32C.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import crc32c

__all__ = ["KEY", "ChecksumError", "ChecksummingSink", "GroupChecksums"]

KEY = b"shardfeed.row_group_crc32c"


class ChecksumError(OSError):
    """A row group's bytes do not match the CRC32C the writer recorded (an ``OSError``: the
    reader treats it as it treats a failed page checksum)."""


class ChecksummingSink:
    """A write-only file in front of ``sink`` that computes the CRC32C of the bytes written since
    the last :meth:`mark`; the writer marks after each row group."""

    def __init__(self, sink: Any) -> None:
        self._sink = sink
        self._crc = 0
        self.size = 0
        self.ends: list[int] = []
        self.crcs: list[int] = []
        self.closed = False

    def write(self, data: Any) -> int:
        chunk = data if isinstance(data, bytes) else bytes(data)  # pyarrow hands over bytes
        self._crc = crc32c.crc32c(chunk, self._crc)
        self._sink.write(chunk)
        self.size += len(chunk)
        return len(chunk)

    def flush(self) -> None:
        flush: Callable[[], Any] | None = getattr(self._sink, "flush", None)
        if flush is not None:
            flush()

    def mark(self) -> None:
        """End a row group's range here."""
        self.ends.append(self.size)
        self.crcs.append(self._crc)
        self._crc = 0

    def metadata(self) -> dict[bytes, bytes]:
        """The footer entry for the ranges marked so far."""
        return {KEY: json.dumps({"ends": self.ends, "crc32c": self.crcs}).encode()}


@dataclass(frozen=True)
class GroupChecksums:
    """The recorded ranges and CRC32Cs of one shard's row groups."""

    ends: tuple[int, ...]
    crcs: tuple[int, ...]

    @classmethod
    def from_metadata(
        cls, metadata: Mapping[bytes, bytes] | None, extents: Sequence[tuple[int, int]]
    ) -> GroupChecksums | None:
        """The checksums in a footer's key-value ``metadata``, checked against the footer's own
        row-group ``extents``; None when the shard has none. Raises ValueError when the entry is
        malformed or its ranges do not hold the row groups the footer describes."""
        raw = (metadata or {}).get(KEY)
        if raw is None:
            return None
        try:
            value = json.loads(raw)
            ends, crcs = tuple(value["ends"]), tuple(value["crc32c"])
        except (ValueError, TypeError, KeyError) as err:
            raise ValueError(f"malformed {KEY.decode()} footer entry: {err}") from None
        numbers = ends + crcs
        if not all(type(n) is int and n >= 0 for n in numbers) or any(c >= 1 << 32 for c in crcs):
            raise ValueError(f"{KEY.decode()}: ends and CRCs must be non-negative integers")
        if len(ends) != len(extents) or len(crcs) != len(extents):
            raise ValueError(
                f"{KEY.decode()} lists {len(ends)} ranges and {len(crcs)} CRCs for "
                f"{len(extents)} row groups"
            )
        start = 0
        for g, ((lo, hi), end) in enumerate(zip(extents, ends, strict=True)):
            if not start <= lo <= hi <= end:
                raise ValueError(
                    f"{KEY.decode()}: row group {g} spans bytes [{lo}, {hi}) but its checksummed "
                    f"range is [{start}, {end})"
                )
            start = end
        return cls(ends, crcs)

    def span(self, group: int) -> tuple[int, int]:
        """``[start, end)`` of the bytes checksummed for ``group``."""
        return (self.ends[group - 1] if group else 0), self.ends[group]

    def check(self, group: int, data: Any) -> None:
        """Raise :class:`ChecksumError` unless ``data`` (the bytes of :meth:`span`) matches."""
        got = crc32c.crc32c(data, 0, 1)  # 1: release the GIL whatever ``data`` is
        if got != self.crcs[group]:
            start, end = self.span(group)
            raise ChecksumError(
                f"row group {group} (bytes {start}-{end}) fails its CRC32C: "
                f"{got:08x}, written as {self.crcs[group]:08x}"
            )
