"""The ``meta/info.json`` model: exactly LeRobot v3.0's fields, strictly parsed."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from shardfeed.schemas._strict import check_unicode, get, non_negative, require_object
from shardfeed.schemas.errors import SchemaError
from shardfeed.schemas.features import FeatureSpec
from shardfeed.schemas.path_template import check_template

CODEBASE_VERSION = "v3.0"
DEFAULT_CHUNKS_SIZE = 1000
DEFAULT_DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
DEFAULT_VIDEO_PATH = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
DEFAULT_DATA_FILES_SIZE_IN_MB = 100
DEFAULT_VIDEO_FILES_SIZE_IN_MB = 500

#: Field order of LeRobot v3.0's info.json, kept so our files diff cleanly against theirs.
INFO_FIELDS = (
    "codebase_version",
    "robot_type",
    "total_episodes",
    "total_frames",
    "total_tasks",
    "chunks_size",
    "fps",
    "splits",
    "data_path",
    "video_path",
    "features",
    "data_files_size_in_mb",
    "video_files_size_in_mb",
)


@dataclass(frozen=True)
class Info:
    """LeRobot v3.0 dataset info. ``fps`` is 0 for data that is not a time series.

    ``from_json`` raises only :class:`SchemaError` naming the field (``UnsafePathError`` for an
    unsafe path template); NaN, infinite numbers and lone surrogates are refused.
    """

    features: FeatureSpec
    total_frames: int
    total_episodes: int = 0
    total_tasks: int = 0
    fps: int = 0
    robot_type: str | None = None
    splits: dict[str, str] = field(default_factory=dict)
    chunks_size: int = DEFAULT_CHUNKS_SIZE
    data_path: str = DEFAULT_DATA_PATH
    video_path: str | None = None
    data_files_size_in_mb: int = DEFAULT_DATA_FILES_SIZE_IN_MB
    video_files_size_in_mb: int = DEFAULT_VIDEO_FILES_SIZE_IN_MB
    codebase_version: str = CODEBASE_VERSION

    def __post_init__(self) -> None:
        if self.chunks_size < 1:
            raise SchemaError("chunks_size", f"must be >= 1, got {self.chunks_size}")
        if not (_finite(self.fps) and self.fps >= 0):  # NaN, inf, or an int no float holds
            raise SchemaError(
                "fps", f"must be finite and >= 0 (0 means not a time series), got {self.fps}"
            )
        for name in ("data_files_size_in_mb", "video_files_size_in_mb"):
            if not (_finite(getattr(self, name)) and getattr(self, name) > 0):
                raise SchemaError(name, f"must be finite and > 0, got {getattr(self, name)}")
        check_template(self.data_path, "data_path", ("chunk_index", "file_index"))
        if self.video_path is not None:
            check_template(
                self.video_path, "video_path", ("video_key", "chunk_index", "file_index")
            )

    def to_json(self) -> dict[str, Any]:
        values = {
            "codebase_version": self.codebase_version,
            "robot_type": self.robot_type,
            "total_episodes": self.total_episodes,
            "total_frames": self.total_frames,
            "total_tasks": self.total_tasks,
            "chunks_size": self.chunks_size,
            "fps": self.fps,
            "splits": dict(self.splits),
            "data_path": self.data_path,
            "video_path": self.video_path,
            "features": self.features.to_json(),
            "data_files_size_in_mb": self.data_files_size_in_mb,
            "video_files_size_in_mb": self.video_files_size_in_mb,
        }
        return {k: values[k] for k in INFO_FIELDS}

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=4, ensure_ascii=False) + "\n"

    @classmethod
    def from_json(cls, obj: Any, source: str = "meta/info.json") -> Info:
        try:
            return cls._from_json(obj)
        except SchemaError as err:
            raise err.with_source(source) from None

    @classmethod
    def _from_json(cls, obj: Any) -> Info:
        obj = require_object(obj, "")
        check_unicode(obj)  # a lone surrogate would fail where the info is written or used
        version = get(obj, "codebase_version", str, "")
        if version != CODEBASE_VERSION:
            raise SchemaError("codebase_version", f"expected {CODEBASE_VERSION!r}, got {version!r}")
        splits = get(obj, "splits", dict, "", optional=True, default={})
        for name in splits:
            get(splits, name, str, "splits")
        return cls(
            features=FeatureSpec.from_json(get(obj, "features", dict, "")),
            total_frames=non_negative(get(obj, "total_frames", int, ""), "total_frames"),
            total_episodes=non_negative(get(obj, "total_episodes", int, ""), "total_episodes"),
            total_tasks=non_negative(get(obj, "total_tasks", int, ""), "total_tasks"),
            fps=get(obj, "fps", (int, float), ""),
            robot_type=get(obj, "robot_type", str, "", optional=True, nullable=True),
            splits=splits,
            chunks_size=get(obj, "chunks_size", int, ""),
            data_path=get(obj, "data_path", str, ""),
            video_path=get(obj, "video_path", str, "", optional=True, nullable=True),
            data_files_size_in_mb=get(
                obj,
                "data_files_size_in_mb",
                (int, float),
                "",
                optional=True,
                default=DEFAULT_DATA_FILES_SIZE_IN_MB,
            ),
            video_files_size_in_mb=get(
                obj,
                "video_files_size_in_mb",
                (int, float),
                "",
                optional=True,
                default=DEFAULT_VIDEO_FILES_SIZE_IN_MB,
            ),
            codebase_version=version,
        )


def _finite(value: float) -> bool:
    """Whether ``value`` is a finite number a float can hold (JSON integers are unbounded)."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False
