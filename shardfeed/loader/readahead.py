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


def hint(path: str, start: int, end: int) -> None:
    """Ask the kernel to start reading ``[start, end)`` of ``path`` now, without waiting."""
    if not hasattr(os, "posix_fadvise") or end <= start:
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, start, end - start, os.POSIX_FADV_WILLNEED)
    finally:
        os.close(fd)
