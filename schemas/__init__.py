"""Data contracts, with no Beam: features, ``meta/info.json``, the manifest, paths and sizes."""

from shardfeed.schemas.errors import SchemaError, ShardfeedError, UnsafePathError
from shardfeed.schemas.features import IMAGE_ARROW_TYPE, Feature, FeatureSpec, feature_from_arrow
from shardfeed.schemas.info import Info
from shardfeed.schemas.manifest import (
    FORMAT_VERSION,
    MANIFEST_PATH,
    FileRecord,
    Manifest,
    Provenance,
    Rejects,
    ShardRecord,
    compute_fingerprint,
)
from shardfeed.schemas.paths import check_relative_path, resolve_within
from shardfeed.schemas.units import format_size, parse_size

__all__ = [
    "FORMAT_VERSION",
    "IMAGE_ARROW_TYPE",
    "MANIFEST_PATH",
    "Feature",
    "FeatureSpec",
    "FileRecord",
    "Info",
    "Manifest",
    "Provenance",
    "Rejects",
    "SchemaError",
    "ShardRecord",
    "ShardfeedError",
    "UnsafePathError",
    "check_relative_path",
    "compute_fingerprint",
    "feature_from_arrow",
    "format_size",
    "parse_size",
    "resolve_within",
]
