"""Beam graphs only: convert, plan shards, assign ranks, build the hot index, stage to tiers.

Beam is the ``[beam]`` extra. Importing this package without it fails with the install command,
so ``shardfeed convert`` and ``shardfeed stage`` can tell the user exactly what to do.
"""

from __future__ import annotations

from shardfeed import BEAM_INSTALL_HINT

try:
    import apache_beam  # noqa: F401
except ImportError as err:  # pragma: no cover - exercised in the core-only test
    raise ImportError(BEAM_INSTALL_HINT) from err
