"""Beam graphs only: convert, plan shards, assign ranks, build the hot index, stage to tiers.

Beam is the ``[beam]`` extra. Importing this package without it fails with the install command,
so ``shardfeed convert`` and ``shardfeed stage`` can tell the user exactly what to do.
"""

from __future__ import annotations

import importlib.util

from shardfeed import BEAM_INSTALL_HINT

# found, not imported: a worker process (sdk_worker.py) sets up logging before Beam loads
if importlib.util.find_spec("apache_beam") is None:  # pragma: no cover - the core-only test
    raise ImportError(BEAM_INSTALL_HINT)
