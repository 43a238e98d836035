"""shardfeed: size-balanced columnar shards in a LeRobot v3.0 layout, manifests, and a fast reader.

The package root stays light: ``import shardfeed`` pulls in neither Beam nor the reader until used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

#: What commands that need the [beam] extra tell a user who lacks it.
BEAM_INSTALL_HINT = "this command needs Apache Beam: pip install 'shardfeed[beam]'"

if TYPE_CHECKING:  # pragma: no cover
    from shardfeed.formats.dataset_writer import write_dataset
    from shardfeed.formats.reader import Dataset, open_dataset

_LAZY = {
    "open_dataset": "shardfeed.formats.reader",
    "Dataset": "shardfeed.formats.reader",
    "write_dataset": "shardfeed.formats.dataset_writer",
}

__all__ = ["Dataset", "__version__", "open_dataset", "write_dataset"]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'shardfeed' has no attribute {name!r}")
