"""How soon a ``shardfeed`` command's Arrow allocator hands freed memory back, set before Arrow
loads.

Arrow's default allocator (mimalloc) returns freed pages to the system 10 ms after they are
freed, and a conversion frees and allocates hundreds of megabytes per file and per shard: each
page taken back and used again is zeroed by the kernel again, in a (huge) page fault. On the text
benchmark's 400,000 documents that was 14% of one thread's samples (``clear_page_erms`` under
``do_huge_pmd_anonymous_page``), and 5.2 s of system time against 3.4 s with the 5 s delay
(BENCHMARKS.md, seventh session). Waiting 5 s lets the next file
or shard reuse the pages; memory is still returned where the pipeline asks for it
(``release_unused`` after each scanned file and written shard) and when it stays unused.

mimalloc reads its options from the environment when Arrow's library loads, so this runs before
``import pyarrow`` in the command's process; worker processes inherit the environment.
"""

from __future__ import annotations

import os
import sys
from collections.abc import MutableMapping

#: mimalloc's option: milliseconds before freed memory is returned to the system (default 10)
PURGE_DELAY = "MIMALLOC_PURGE_DELAY"
#: the delay a command asks for
DELAY_MS = 5000


def keep_freed_pages(environ: MutableMapping[str, str] = os.environ) -> bool:
    """Ask Arrow's allocator to keep freed pages for :data:`DELAY_MS` before returning them,
    unless Arrow is loaded already (too late for this process) or the variable is set (the
    user's choice stays). Returns whether it was set here."""
    if "pyarrow" in sys.modules or PURGE_DELAY in environ:
        return False
    environ[PURGE_DELAY] = str(DELAY_MS)
    return True
