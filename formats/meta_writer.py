"""Writers for LeRobot v3.0 metadata: info.json, stats.json, tasks.parquet, episodes parquet.

Column names, order and dtypes follow LeRobot v3.0 files as published, so LeRobot and pandas read
them unchanged. Every file is written atomically and its FileRecord returned for the manifest.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from shardfeed.formats.atomic import atomic_open, atomic_write_bytes
from shardfeed.formats.layout import INFO_PATH, STATS_PATH, TASKS_PATH
from shardfeed.formats.stats import QUANTILES, FeatureStats, StatsSummary
from shardfeed.schemas.errors import ShardfeedError
from shardfeed.schemas.features import FeatureSpec
from shardfeed.schemas.info import Info
from shardfeed.schemas.manifest import FileRecord

# pandas reads tasks.parquet with the task string as its index, exactly as LeRobot writes it
_TASKS_PANDAS_META = {
    "index_columns": ["__index_level_0__"],
    "column_indexes": [
        {
            "name": None,
            "field_name": None,
            "pandas_type": "unicode",
            "numpy_type": "object",
            "metadata": {"encoding": "UTF-8"},
        }
    ],
    "columns": [
        {
            "name": "task_index",
            "field_name": "task_index",
            "pandas_type": "int64",
            "numpy_type": "int64",
            "metadata": None,
        },
        {
            "name": None,
            "field_name": "__index_level_0__",
            "pandas_type": "unicode",
            "numpy_type": "object",
            "metadata": None,
        },
    ],
    "attributes": {},
    "creator": {"library": "shardfeed", "version": "1"},
}


@dataclass(frozen=True)
class EpisodeVideo:
    """Where one episode's frames of one video feature live: LeRobot's ``videos/{key}/...`` columns.

    Frame ``k`` of the episode is at ``from_timestamp + k / fps`` seconds in the MP4 at
    ``video_path`` (chunk ``chunk_index``, file ``file_index``).
    """

    chunk_index: int
    file_index: int
    from_timestamp: float
    to_timestamp: float

    def to_json(self) -> dict[str, Any]:
        return {
            "chunk_index": self.chunk_index,
            "file_index": self.file_index,
            "from_timestamp": self.from_timestamp,
            "to_timestamp": self.to_timestamp,
        }

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> EpisodeVideo:
        return cls(
            int(obj["chunk_index"]),
            int(obj["file_index"]),
            float(obj["from_timestamp"]),
            float(obj["to_timestamp"]),
        )


@dataclass
class EpisodeRecord:
    """One episode's row in ``meta/episodes``; ``stats`` maps feature name to its FeatureStats
    (a :class:`StatsSummary` once read back from a shard writer's outcome).

    ``videos`` maps each video feature to where the episode's frames are (empty without videos).
    """

    episode_index: int
    data_chunk_index: int
    data_file_index: int
    dataset_from_index: int
    dataset_to_index: int
    tasks: list[str]
    stats: dict[str, FeatureStats | StatsSummary] = field(default_factory=dict)
    source_episode_index: int | None = None  # the id in the source, when conversion renumbered
    videos: dict[str, EpisodeVideo] = field(default_factory=dict)

    @property
    def length(self) -> int:
        return self.dataset_to_index - self.dataset_from_index


def write_bytes_file(root: str, rel_path: str, data: bytes) -> FileRecord:
    atomic_write_bytes(os.path.join(root, rel_path), data)
    return FileRecord(rel_path, len(data), hashlib.sha256(data).hexdigest())


def write_parquet_file(root: str, rel_path: str, table: pa.Table) -> FileRecord:
    path = os.path.join(root, rel_path)
    with atomic_open(path) as handle:
        pq.write_table(table, handle, compression="snappy")
    return file_record(root, rel_path)


def file_record(root: str, rel_path: str) -> FileRecord:
    digest = hashlib.sha256()
    size = 0
    with open(os.path.join(root, rel_path), "rb") as handle:
        while chunk := handle.read(8 << 20):
            digest.update(chunk)
            size += len(chunk)
    return FileRecord(rel_path, size, digest.hexdigest())


def write_info(root: str, info: Info) -> FileRecord:
    return write_bytes_file(root, INFO_PATH, info.dumps().encode())


def stats_json(spec: FeatureSpec, stats: Mapping[str, FeatureStats]) -> dict[str, Any]:
    return {
        f.name: stats[f.name].to_json() for f in spec if f.name in stats and stats[f.name].count
    }


def write_stats(root: str, spec: FeatureSpec, stats: Mapping[str, FeatureStats]) -> FileRecord:
    text = json.dumps(stats_json(spec, stats), indent=4) + "\n"
    return write_bytes_file(root, STATS_PATH, text.encode())


def tasks_table(tasks: Sequence[str]) -> pa.Table:
    schema = pa.schema(
        [("task_index", pa.int64()), ("__index_level_0__", pa.string())],
        metadata={b"pandas": json.dumps(_TASKS_PANDAS_META).encode()},
    )
    return pa.table(
        [pa.array(range(len(tasks)), pa.int64()), pa.array(list(tasks), pa.string())], schema=schema
    )


def write_tasks(root: str, tasks: Sequence[str]) -> FileRecord:
    return write_parquet_file(root, TASKS_PATH, tasks_table(tasks))


def episodes_table(
    spec: FeatureSpec, episodes: Sequence[EpisodeRecord], chunk_index: int = 0, file_index: int = 0
) -> pa.Table:
    """LeRobot v3.0 episode columns, in their order; per-episode stats as ``stats/{key}/{stat}``.

    Stats columns cover every feature some episode has stats for: numeric ones and ``image`` ones
    (per channel, ``list<list<list<double>>>`` like LeRobot's camera columns).

    A video feature of ``spec`` whose frames were written adds LeRobot's ``videos/{key}/...``
    columns after ``dataset_to_index``: ``chunk_index``, ``file_index`` (int64), ``from_timestamp``
    and ``to_timestamp`` (float64); every episode must then say where its frames are.
    """
    columns: dict[str, pa.Array] = {
        "episode_index": pa.array([e.episode_index for e in episodes], pa.int64()),
        "data/chunk_index": pa.array([e.data_chunk_index for e in episodes], pa.int64()),
        "data/file_index": pa.array([e.data_file_index for e in episodes], pa.int64()),
        "dataset_from_index": pa.array([e.dataset_from_index for e in episodes], pa.int64()),
        "dataset_to_index": pa.array([e.dataset_to_index for e in episodes], pa.int64()),
    }
    for key in (f.name for f in spec if f.dtype == "video"):
        missing = [e.episode_index for e in episodes if key not in e.videos]
        if len(missing) == len(episodes):
            continue  # no frames written for this feature (e.g. a writer given no MP4s)
        if missing:
            raise ShardfeedError(
                f"video feature {key!r} has no video for episode {missing[0]} "
                f"({len(missing)} episodes without one)"
            )
        spans = [e.videos[key] for e in episodes]
        prefix = f"videos/{key}/"
        columns[prefix + "chunk_index"] = pa.array([v.chunk_index for v in spans], pa.int64())
        columns[prefix + "file_index"] = pa.array([v.file_index for v in spans], pa.int64())
        columns[prefix + "from_timestamp"] = pa.array(
            [v.from_timestamp for v in spans], pa.float64()
        )
        columns[prefix + "to_timestamp"] = pa.array([v.to_timestamp for v in spans], pa.float64())
    columns |= {
        "tasks": pa.array([e.tasks for e in episodes], pa.list_(pa.string())),
        "length": pa.array([e.length for e in episodes], pa.int64()),
    }
    if any(e.source_episode_index is not None for e in episodes):
        columns["source_episode_index"] = pa.array(
            [e.source_episode_index for e in episodes], pa.int64()
        )
    for feature in spec:
        if not any(feature.name in e.stats for e in episodes):
            continue
        # an episode without values (an image feature with no inline frame) gets null stats
        present = [e.stats.get(feature.name) for e in episodes]
        per_episode = [s.to_json() if s is not None and s.count else None for s in present]
        # nesting follows the stats' shape: the feature's for numeric features, (3, 1, 1) for images
        depth = len(next(s for s in present if s is not None).shape)
        for key in ("min", "max", "mean", "std", "count", *QUANTILES):
            if key == "count":
                atype: pa.DataType = pa.list_(pa.int64())
            else:
                leaf = pa.float64()
                if key in ("min", "max") and _is_integer(feature.dtype):
                    leaf = pa.uint64() if feature.dtype == "uint64" else pa.int64()
                atype = leaf
                for _ in range(depth):
                    atype = pa.list_(atype)
            columns[f"stats/{feature.name}/{key}"] = pa.array(
                [None if s is None else s[key] for s in per_episode], atype
            )
    columns["meta/episodes/chunk_index"] = pa.array([chunk_index] * len(episodes), pa.int64())
    columns["meta/episodes/file_index"] = pa.array([file_index] * len(episodes), pa.int64())
    return pa.table(columns)


def _is_integer(dtype: str) -> bool:
    return dtype.startswith(("int", "uint")) or dtype == "bool"
