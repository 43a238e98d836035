"""Records shared by the files planners add to a published dataset (assignments, hot index,
cache plans): which dataset a file was made for, and the size and sha256 of its table.

Such files are written after the manifest and are not listed in it, so each one carries these
records itself; a loader checks both before trusting the file.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from shardfeed.schemas._strict import count, get, require_object
from shardfeed.schemas.errors import SchemaError


@dataclass(frozen=True)
class DatasetRef:
    """The dataset an assignment was planned for; loading checks all three."""

    fingerprint: str
    num_samples: int
    num_shards: int

    def to_json(self) -> dict[str, Any]:
        return {
            "fingerprint": self.fingerprint,
            "num_samples": self.num_samples,
            "num_shards": self.num_shards,
        }

    @classmethod
    def from_json(cls, obj: Any, where: str) -> DatasetRef:
        obj = require_object(obj, where)
        return cls(
            get(obj, "fingerprint", str, where),
            count(obj, "num_samples", where),
            count(obj, "num_shards", where),
        )


@dataclass(frozen=True)
class TableRecord:
    path: str
    rows: int
    bytes: int
    sha256: str

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "rows": self.rows, "bytes": self.bytes, "sha256": self.sha256}

    @classmethod
    def from_json(cls, obj: Any, where: str) -> TableRecord:
        obj = require_object(obj, where)
        sha = get(obj, "sha256", str, where)
        if not re.fullmatch(r"[0-9a-f]{64}", sha):
            raise SchemaError(f"{where}.sha256", "expected 64 lowercase hex digits")
        return cls(
            get(obj, "path", str, where),
            count(obj, "rows", where),
            count(obj, "bytes", where),
            sha,
        )
