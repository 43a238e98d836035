"""Bring a byte range of a local file into the page cache ahead of its decode.

A cold single stream of small reads (what a decoder issues, and what ``cat`` does) leaves most
of a disk's bandwidth unused; large reads from a few threads reach its sequential rate (about
3x on this project's test machine, docs/BENCHMARKS.md). So the loader's I/O threads read each
upcoming row group here, in ``CHUNK``-sized ``pread`` calls after a ``POSIX_FADV_WILLNEED`` hint,
and the decoder then finds the bytes in memory. The bytes read are discarded: the page cache
keeps them, and nothing is counted twice against the process's memory.
"""

from __future__ import annotations

import os
import threading

CHUNK = 4 << 20

_scratch = threading.local()


def page_in(path: str, start: int, end: int) -> int:
    """Read ``[start, end)`` of ``path`` through the page cache; returns the bytes read."""
    buffer = getattr(_scratch, "buffer", None)
    if buffer is None:
        buffer = _scratch.buffer = memoryview(bytearray(CHUNK))
    fd = os.open(path, os.O_RDONLY)
    try:
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(fd, start, end - start, os.POSIX_FADV_WILLNEED)
        done = 0
        while start + done < end:
            n = os.preadv(fd, [buffer[: min(CHUNK, end - start - done)]], start + done)
            if n == 0:
                break  # the file is shorter than its footer says; the decoder will report it
            done += n
        return done
    finally:
        os.close(fd)


def hint(path: str, start: int, end: int) -> None:
    """Ask the kernel to start reading ``[start, end)`` now, without waiting for it."""
    if not hasattr(os, "posix_fadvise"):
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, start, end - start, os.POSIX_FADV_WILLNEED)
    finally:
        os.close(fd)
