"""On-disk formats, with no Beam: the dataset layout, its writer, the fast reader and the verifier.

Names load on first use, so a command that only reads a manifest does not import the writer.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "CorruptShardError": "shardfeed.formats.errors",
    "Dataset": "shardfeed.formats.reader",
    "DatasetWriter": "shardfeed.formats.dataset_writer",
    "IncompleteDatasetError": "shardfeed.formats.errors",
    "VerifyReport": "shardfeed.formats.verify",
    "open_dataset": "shardfeed.formats.reader",
    "verify_dataset": "shardfeed.formats.verify",
    "write_dataset": "shardfeed.formats.dataset_writer",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'shardfeed.formats' has no attribute {name!r}")
