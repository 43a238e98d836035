"""Giving the C heap's free memory back to the system after a shard that held a lot of it.

A shard of a million small records holds a few hundred MB of Python and NumPy bookkeeping (its
units, row sizes, stats, the sidecar's JSON) while it is written. Freed, that memory stays in
glibc's arena of the thread that used it, and the next large shard may run on the other thread,
with its own arena: bench_memory's 10M-record run peaked at 891-1022 MB over three runs this way,
845 and 799 MB with a trim after each large shard. Arrow's own pool is emptied separately
(``MemoryPool.release_unused``). ``malloc_trim`` walks every arena, about 4 ms when there is
nothing to return, so it runs after large shards only.
"""

from __future__ import annotations

import ctypes
import functools
import sys
from collections.abc import Callable


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or None (another C library, another system)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        trim = ctypes.CDLL(None).malloc_trim  # this process's own C library
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


def can_trim() -> bool:
    """Whether this process's C library has ``malloc_trim`` (glibc)."""
    return _malloc_trim() is not None


def trim_c_heap() -> bool:
    """Return the free memory of every glibc arena to the system; False where there is no
    ``malloc_trim`` (nothing is done)."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
