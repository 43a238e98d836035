"""LeRobot v2.1 metadata: ``info.json``, ``episodes.jsonl``, ``tasks.jsonl``, ``episodes_stats.jsonl``.

A v2.1 dataset stores one Parquet file per episode at ``info.json``'s ``data_path`` template
(``data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet``) and, for each video feature,
one MP4 per episode at ``video_path`` (``videos/chunk-{episode_chunk:03d}/{video_key}/episode_...mp4``),
where ``episode_chunk = episode_index // chunks_size``.

Everything here is parsing of untrusted JSON: every failure is a :class:`SchemaError` naming the file,
the line and the field. Totals in ``info.json`` are parsed but never trusted; the source reader
compares them with the data. Only ``shardfeed.schemas`` is used, so this stays Beam-free.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from shardfeed.schemas._strict import get, non_negative, require_object
from shardfeed.schemas.errors import SchemaError
from shardfeed.schemas.features import FeatureSpec
from shardfeed.schemas.path_template import check_template, expand

V21_VERSIONS = ("v2.1",)
INFO_PATH = "meta/info.json"
EPISODES_JSONL = "meta/episodes.jsonl"
TASKS_JSONL = "meta/tasks.jsonl"
EPISODES_STATS_JSONL = "meta/episodes_stats.jsonl"
DEFAULT_V21_DATA_PATH = "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet"
DEFAULT_V21_VIDEO_PATH = (
    "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4"
)


@dataclass(frozen=True)
class V21Info:
    """The parts of a v2.1 ``info.json`` a reader needs; totals are kept only to be compared."""

    features: FeatureSpec
    fps: int | float
    total_frames: int
    total_episodes: int
    total_tasks: int
    chunks_size: int
    data_path: str
    video_path: str | None = None
    robot_type: str | None = None
    total_videos: int = 0
    total_chunks: int = 0
    splits: dict[str, str] = field(default_factory=dict)
    codebase_version: str = "v2.1"

    def data_file(self, episode_index: int) -> str:
        """Root-relative Parquet path of one episode, from the ``data_path`` template."""
        return expand(
            self.data_path,
            "data_path",
            episode_chunk=episode_index // self.chunks_size,
            episode_index=episode_index,
        )

    def video_file(self, video_key: str, episode_index: int) -> str:
        """Root-relative MP4 path of one episode's video for ``video_key``."""
        if self.video_path is None:
            raise SchemaError("video_path", "is null but the dataset has video features")
        return expand(
            self.video_path,
            "video_path",
            episode_chunk=episode_index // self.chunks_size,
            episode_index=episode_index,
            video_key=video_key,
        )


@dataclass(frozen=True)
class V21Episode:
    """One line of ``episodes.jsonl``."""

    episode_index: int
    length: int
    tasks: tuple[str, ...] = ()


def parse_info(obj: Any, source: str = INFO_PATH) -> V21Info:
    """Strictly parse a v2.1 ``info.json`` object."""
    try:
        return _parse_info(obj)
    except SchemaError as err:
        raise err.with_source(source) from None


def _parse_info(obj: Any) -> V21Info:
    obj = require_object(obj, "")
    version = get(obj, "codebase_version", str, "")
    if version not in V21_VERSIONS:
        raise SchemaError("codebase_version", f"expected one of {V21_VERSIONS}, got {version!r}")
    splits = get(obj, "splits", dict, "", optional=True, default={})
    for name in splits:
        get(splits, name, str, "splits")
    chunks_size = get(obj, "chunks_size", int, "")
    if chunks_size < 1:
        raise SchemaError("chunks_size", f"must be >= 1, got {chunks_size}")
    fps = get(obj, "fps", (int, float), "")
    if fps < 0:
        raise SchemaError("fps", f"must be >= 0, got {fps}")
    data_path = get(obj, "data_path", str, "", optional=True, default=DEFAULT_V21_DATA_PATH)
    check_template(data_path, "data_path", ("episode_index",))
    video_path = get(obj, "video_path", str, "", optional=True, nullable=True)
    if video_path is not None:
        check_template(video_path, "video_path", ("episode_index", "video_key"))
    return V21Info(
        features=FeatureSpec.from_json(get(obj, "features", dict, "")),
        fps=fps,
        total_frames=non_negative(get(obj, "total_frames", int, ""), "total_frames"),
        total_episodes=non_negative(get(obj, "total_episodes", int, ""), "total_episodes"),
        total_tasks=non_negative(
            get(obj, "total_tasks", int, "", optional=True, default=0), "total_tasks"
        ),
        chunks_size=chunks_size,
        data_path=data_path,
        video_path=video_path,
        robot_type=get(obj, "robot_type", str, "", optional=True, nullable=True),
        total_videos=non_negative(
            get(obj, "total_videos", int, "", optional=True, default=0), "total_videos"
        ),
        total_chunks=non_negative(
            get(obj, "total_chunks", int, "", optional=True, default=0), "total_chunks"
        ),
        splits=dict(splits),
        codebase_version=version,
    )


def parse_episodes_jsonl(text: str, source: str = EPISODES_JSONL) -> list[V21Episode]:
    """Episodes sorted by ``episode_index``; duplicates and malformed lines are errors."""
    episodes: dict[int, V21Episode] = {}
    for line_no, obj in _jsonl(text, source):
        where = f"line {line_no}"
        index = _index(obj, "episode_index", where, source)
        length = _index(obj, "length", where, source)
        try:
            tasks = get(obj, "tasks", list, where, optional=True, default=[])
            for i, task in enumerate(tasks):
                if not isinstance(task, str):
                    raise SchemaError(f"{where}.tasks[{i}]", f"expected string, got {task!r:.60}")
        except SchemaError as err:
            raise err.with_source(source) from None
        if index in episodes:
            raise SchemaError(f"{where}.episode_index", f"duplicate episode {index}", source=source)
        episodes[index] = V21Episode(index, length, tuple(tasks))
    return [episodes[i] for i in sorted(episodes)]


def parse_tasks_jsonl(text: str, source: str = TASKS_JSONL) -> list[str]:
    """Task strings ordered by ``task_index``, which must run 0..n-1 without gaps or repeats."""
    tasks: dict[int, str] = {}
    for line_no, obj in _jsonl(text, source):
        where = f"line {line_no}"
        index = _index(obj, "task_index", where, source)
        try:
            task = get(obj, "task", str, where)
        except SchemaError as err:
            raise err.with_source(source) from None
        if index in tasks:
            raise SchemaError(f"{where}.task_index", f"duplicate task {index}", source=source)
        tasks[index] = task
    if sorted(tasks) != list(range(len(tasks))):
        raise SchemaError(
            "task_index",
            f"task indices are not 0..{len(tasks) - 1}: {sorted(tasks)}",
            source=source,
        )
    return [tasks[i] for i in range(len(tasks))]


def parse_episodes_stats_jsonl(
    text: str, source: str = EPISODES_STATS_JSONL
) -> dict[int, dict[str, Any]]:
    """Per-episode stats ``{episode_index: {feature: {min, max, mean, std, count}}}``.

    Only the envelope is checked (an object per feature); shardfeed recomputes statistics from the
    data, so these are informational.
    """
    out: dict[int, dict[str, Any]] = {}
    for line_no, obj in _jsonl(text, source):
        where = f"line {line_no}"
        index = _index(obj, "episode_index", where, source)
        try:
            stats = get(obj, "stats", dict, where)
            for name, value in stats.items():
                require_object(value, f"{where}.stats.{name}")
        except SchemaError as err:
            raise err.with_source(source) from None
        if index in out:
            raise SchemaError(f"{where}.episode_index", f"duplicate episode {index}", source=source)
        out[index] = stats
    return out


def _jsonl(text: str, source: str):
    for line_no, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError as err:
            raise SchemaError(f"line {line_no}", f"not valid JSON ({err})", source=source) from None
        if not isinstance(obj, dict):
            raise SchemaError(
                f"line {line_no}", f"expected object, got {type(obj).__name__}", source=source
            )
        yield line_no, obj


def _index(obj: dict[str, Any], key: str, where: str, source: str) -> int:
    try:
        return non_negative(get(obj, key, int, where), f"{where}.{key}")
    except SchemaError as err:
        raise err.with_source(source) from None


def load_text(read_bytes: Callable[[str], bytes], rel: str) -> str:
    """Decode a metadata file as UTF-8 with a clean error."""
    try:
        return read_bytes(rel).decode("utf-8")
    except UnicodeDecodeError as err:
        raise SchemaError("<root>", f"not valid UTF-8 ({err})", source=rel) from None
