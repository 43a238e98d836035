"""Kernel read-ahead hints for the byte ranges a loader is about to decode.

A cold single stream of small reads (what a decoder faulting in a memory map issues, and what
``cat`` does) leaves most of a virtual disk's bandwidth unused; many large requests in flight
reach its sequential rate. ``POSIX_FADV_WILLNEED`` on a row group's byte range queues the
whole range for reading at once and returns; the decoder later finds the pages in memory. The
hint copies nothing, so a warm page cache costs nothing either (an earlier version read each
range with ``pread`` into a scratch buffer: the same cold rate here, but a memory copy of every
byte when warm).
"""

from __future__ import annotations

import os
import threading


class ReadAhead:
    """Read-ahead hints for one loader pass, with one open descriptor per file (opening and
    closing one per hint cost more than the hint); thread-safe; :meth:`close` ends it."""

    def __init__(self) -> None:
        self._fds: dict[str, int] = {}
        self._lock = threading.Lock()

    def hint(self, path: str, start: int, end: int) -> None:
        """Ask the kernel to start reading ``[start, end)`` of ``path`` now, without waiting."""
        if not hasattr(os, "posix_fadvise") or end <= start:
            return
        with self._lock:
            fd = self._fds.get(path)
            if fd is None:
                fd = self._fds[path] = os.open(path, os.O_RDONLY)
        os.posix_fadvise(fd, start, end - start, os.POSIX_FADV_WILLNEED)

    def close(self) -> None:
        with self._lock:
            fds, self._fds = self._fds, {}
        for fd in fds.values():
            os.close(fd)
