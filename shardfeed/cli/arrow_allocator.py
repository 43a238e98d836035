"""How a ``shardfeed`` command's Arrow allocator hands freed memory back, set before Arrow loads.

Arrow's default allocator (mimalloc) returns freed pages to the system within milliseconds, and
a conversion frees and allocates hundreds of megabytes per file and per shard: each page it takes
back is zeroed by the kernel again, as a (huge) page fault. On the text benchmark's 400,000
documents that was 14% of one thread's samples (``clear_page_erms`` under
``do_huge_pmd_anonymous_page``) and 2.6 s of system time. Told to reset freed pages
(``MADV_FREE``) instead of decommitting them, mimalloc reuses them without a fault while the
kernel may still reclaim them under memory pressure (BENCHMARKS.md has the figures).

mimalloc reads its options from the environment when Arrow's library loads, so this runs before
``import pyarrow`` in the command's process; worker processes inherit the environment.
"""

from __future__ import annotations

import os
import sys
from collections.abc import MutableMapping

#: mimalloc's option: 0 resets (``MADV_FREE``) freed pages instead of decommitting them
PURGE_DECOMMITS = "MIMALLOC_PURGE_DECOMMITS"


def keep_freed_pages(environ: MutableMapping[str, str] = os.environ) -> bool:
    """Ask Arrow's allocator to reset rather than decommit freed pages, unless Arrow is loaded
    already (too late for this process) or the variable is set (the user's choice stays).
    Returns whether it was set here."""
    if "pyarrow" in sys.modules or PURGE_DECOMMITS in environ:
        return False
    environ[PURGE_DECOMMITS] = "0"
    return True
