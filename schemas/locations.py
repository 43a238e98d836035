"""``meta/shardfeed/locations.json``: where staged copies of a dataset's files live.

Written by ``shardfeed stage`` into the source dataset, atomically, after every copy it lists was
verified. ``tiers`` maps a tier name to the root URI of its copy; ``files`` maps each file
copied to a shared tier (dataset-relative path) to the tiers holding a verified copy. Node tiers
are listed in ``tiers`` only: each node holds its own subset (``shardfeed warm``), so a reader
checks its local copy itself. Paths are checked like manifest paths, so no entry can point
outside a tier root.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from shardfeed.schemas._strict import (
    JsonDocument,
    count,
    get,
    parse_version,
    require_object,
)
from shardfeed.schemas.errors import SchemaError
from shardfeed.schemas.paths import check_relative_path
from shardfeed.schemas.sidecar import DatasetRef
from shardfeed.schemas.tiers import SCOPES, check_path_template

FORMAT_VERSION = "1.0"
FORMAT_MAJOR = 1
LOCATIONS_PATH = "meta/shardfeed/locations.json"


@dataclass(frozen=True)
class TierCopy:
    """A tier's copy of the dataset: its root, scope, declared read bandwidth (bytes/s; readers
    prefer node tiers, then faster shared tiers), and whether it holds every file."""

    uri: str
    scope: str
    complete: bool
    read_bandwidth: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "uri": self.uri,
            "scope": self.scope,
            "complete": self.complete,
            "read_bandwidth": self.read_bandwidth,
        }

    @classmethod
    def from_json(cls, obj: Any, where: str) -> TierCopy:
        obj = require_object(obj, where)
        scope = get(obj, "scope", str, where)
        if scope not in SCOPES:
            raise SchemaError(f"{where}.scope", f"expected one of {SCOPES}, got {scope!r}")
        uri = check_path_template(get(obj, "uri", str, where), f"{where}.uri")
        bandwidth = count(obj, "read_bandwidth", where) if "read_bandwidth" in obj else 0
        return cls(uri, scope, get(obj, "complete", bool, where), bandwidth)


@dataclass(frozen=True)
class Locations(JsonDocument):
    dataset: DatasetRef
    tiers: dict[str, TierCopy] = field(default_factory=dict)
    files: dict[str, tuple[str, ...]] = field(default_factory=dict)
    format_version: str = FORMAT_VERSION

    def __post_init__(self) -> None:
        for path, names in self.files.items():
            unknown = [n for n in names if n not in self.tiers]
            if unknown:
                raise SchemaError(
                    f"files.{path}", f"names tier(s) {unknown} with no entry in tiers"
                )

    def uri(self, tier: str, rel: str) -> str:
        return f"{self.tiers[tier].uri.rstrip('/')}/{rel}"

    def to_json(self) -> dict[str, Any]:
        return {
            "format_version": self.format_version,
            "dataset": self.dataset.to_json(),
            "tiers": {name: copy.to_json() for name, copy in sorted(self.tiers.items())},
            "files": {path: list(names) for path, names in sorted(self.files.items())},
        }

    @classmethod
    def loads(cls, text: str | bytes, source: str = LOCATIONS_PATH) -> Locations:
        return super().loads(text, source)

    @classmethod
    def from_json(cls, obj: Any) -> Locations:
        obj = require_object(obj, "")
        version = get(obj, "format_version", str, "")
        parse_version(version, "format_version", FORMAT_MAJOR)
        tiers = {
            str(name): TierCopy.from_json(value, f"tiers.{name}")
            for name, value in get(obj, "tiers", dict, "").items()
        }
        files = {}
        for path, names in get(obj, "files", dict, "").items():
            where = f"files.{path}"
            check_relative_path(path, where)
            if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
                raise SchemaError(where, "expected a list of tier names")
            files[path] = tuple(names)
        return cls(
            DatasetRef.from_json(get(obj, "dataset", dict, ""), "dataset"),
            tiers,
            files,
            version,
        )
