"""Assemble a dataset: shards in order, then LeRobot metadata, then the manifest, last.

``DatasetWriter`` is the incremental API the pipelines use (one shard at a time, in plan order);
``write_dataset`` is the one-call Python API for data that fits in memory.
"""

from __future__ import annotations

import itertools
import os
import shutil
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from shardfeed import __version__
from shardfeed.formats.atomic import atomic_write_bytes
from shardfeed.formats.columns import TableLike, column_to_numpy, conform, to_table
from shardfeed.formats.encoding import get_encoding
from shardfeed.formats.layout import DATASET_DIRS, chunk_file_index, data_path, episodes_path
from shardfeed.formats.meta_writer import (
    EpisodeRecord,
    episodes_table,
    write_info,
    write_parquet_file,
    write_stats,
    write_tasks,
)
from shardfeed.formats.payload import table_row_bytes
from shardfeed.formats.shard_writer import DEFAULT_ROW_GROUP_BYTES, write_shard
from shardfeed.formats.stats import FeatureStats, merge_all
from shardfeed.planning.partition import contiguous_cuts, num_parts_for
from shardfeed.schemas.errors import ShardfeedError
from shardfeed.schemas.features import Feature, FeatureSpec
from shardfeed.schemas.info import DEFAULT_VIDEO_PATH, Info
from shardfeed.schemas.manifest import (
    MANIFEST_PATH,
    FileRecord,
    Manifest,
    Provenance,
    Rejects,
    ShardRecord,
    compute_fingerprint,
)
from shardfeed.schemas.units import parse_size

DEFAULT_TARGET_SHARD_BYTES = 100 * 10**6  # 100 MB, LeRobot's data_files_size_in_mb default


class DatasetExistsError(ShardfeedError):
    pass


def _stats_features(spec: FeatureSpec) -> list[Feature]:
    return [f for f in spec.stored if f.is_numeric]


class DatasetWriter:
    """Write shards in plan order, then ``finalize()`` writes metadata and, last, the manifest.

    A dataset is episodic when its features include ``episode_index``: then an episode must sit in
    one shard, ``index`` (if present) must run 0..N-1 in file order, and ``meta/episodes`` is written.
    """

    def __init__(
        self,
        root: str,
        features: FeatureSpec | Mapping[str, Any] | Sequence[Feature],
        *,
        tasks: Sequence[str] = (),
        fps: int | float = 0,
        robot_type: str | None = None,
        target_shard_bytes: int = DEFAULT_TARGET_SHARD_BYTES,
        row_group_bytes: int = DEFAULT_ROW_GROUP_BYTES,
        encoding: str = "parquet",
        source: str = "",
        content_options: Mapping[str, Any] | None = None,
        overwrite: bool = False,
    ) -> None:
        self.root = os.fspath(root)
        self.spec = features if isinstance(features, FeatureSpec) else FeatureSpec.of(features)
        self.tasks = list(tasks)
        self.fps = fps
        self.robot_type = robot_type
        self.target_shard_bytes = target_shard_bytes
        self.row_group_bytes = row_group_bytes
        self.encoding = get_encoding(encoding)
        self.source = source
        self.content_options = dict(content_options or {})
        self.episodic = "episode_index" in self.spec
        self._shards: list[ShardRecord] = []
        self._shard_stats: list[dict[str, FeatureStats]] = []
        self._episodes: dict[int, EpisodeRecord] = {}
        self._prepare_root(overwrite)

    def _prepare_root(self, overwrite: bool) -> None:
        manifest = os.path.join(self.root, MANIFEST_PATH)
        if os.path.isdir(self.root) and os.listdir(self.root):
            if not overwrite:
                what = "a dataset" if os.path.exists(manifest) else "files"
                raise DatasetExistsError(
                    f"{self.root} already holds {what}; pass overwrite=True (--overwrite) to replace it"
                )
            # the manifest goes first, so an interrupted overwrite never looks complete
            if os.path.exists(manifest):
                os.unlink(manifest)
            for name in DATASET_DIRS:
                shutil.rmtree(os.path.join(self.root, name), ignore_errors=True)
        os.makedirs(self.root, exist_ok=True)

    @property
    def num_samples(self) -> int:
        return self._shards[-1].index_end if self._shards else 0

    def add_shard(self, data: TableLike) -> ShardRecord:
        """Write the next shard (rows in final order) and fold its stats and episodes in."""
        table = (
            data
            if isinstance(data, pa.Table) and data.schema == self.spec.arrow_schema()
            else to_table(data, self.spec)
        )
        number = len(self._shards)
        start = self.num_samples
        self._check_index(table, start)
        record = write_shard(
            self.root,
            data_path(number, template=self.encoding_template()),
            table,
            self.spec,
            index_start=start,
            row_group_bytes=self.row_group_bytes,
            encoding=self.encoding,
        )
        self._shards.append(record)
        columns = {
            f.name: _valid_values(table.column(f.name), f) for f in _stats_features(self.spec)
        }
        self._shard_stats.append(
            {
                name: FeatureStats(self.spec[name].shape, integer=_integer(self.spec[name])).add(
                    values
                )
                for name, (values, _) in columns.items()
            }
        )
        if self.episodic:
            self._add_episodes(columns, number, start)
        return record

    def encoding_template(self) -> str:
        return "data/chunk-{chunk_index:03d}/file-{file_index:03d}" + self.encoding.extension

    def _check_index(self, table: pa.Table, start: int) -> None:
        if not (self.episodic and "index" in self.spec):
            return
        index = table.column("index").to_numpy()
        if not np.array_equal(index, np.arange(start, start + table.num_rows)):
            raise ShardfeedError(
                "the 'index' column must run 0..N-1 in file order (LeRobot reads it that way); renumber it before writing"
            )

    def _add_episodes(
        self, columns: dict[str, tuple[np.ndarray, np.ndarray | None]], number: int, start: int
    ) -> None:
        for required in ("episode_index", "task_index"):
            if required in columns and columns[required][1] is not None:
                raise ShardfeedError(f"'{required}' has nulls; every frame needs one")
        episode_ids = columns["episode_index"][0].reshape(-1)
        chunk, file = chunk_file_index(number)
        run_starts = np.flatnonzero(np.r_[True, episode_ids[1:] != episode_ids[:-1]])
        run_ends = np.r_[run_starts[1:], len(episode_ids)]
        task_ids = columns["task_index"][0].reshape(-1) if "task_index" in columns else None
        for a, b in zip(run_starts.tolist(), run_ends.tolist(), strict=True):
            ep = int(episode_ids[a])
            if ep in self._episodes:
                raise ShardfeedError(
                    f"episode {ep} is split (rows {start + a}.. in shard {number} and earlier); an episode must be contiguous in one shard"
                )
            tasks = []
            if task_ids is not None:
                for t in dict.fromkeys(task_ids[a:b].tolist()):
                    if not 0 <= t < len(self.tasks):
                        raise ShardfeedError(
                            f"episode {ep}: task_index {t} has no entry in tasks ({len(self.tasks)} tasks)"
                        )
                    tasks.append(self.tasks[t])
            stats = {
                name: FeatureStats(self.spec[name].shape, integer=_integer(self.spec[name])).add(
                    _rows(values, positions, a, b)
                )
                for name, (values, positions) in columns.items()
            }
            self._episodes[ep] = EpisodeRecord(ep, chunk, file, start + a, start + b, tasks, stats)

    def finalize(self, rejects: Rejects | None = None) -> Manifest:
        """Write stats, tasks, episodes and info, then the manifest (last); return the manifest."""
        files: list[FileRecord] = []
        stats = merge_all(self._shard_stats)
        files.append(write_stats(self.root, self.spec, stats))
        if self.episodic or self.tasks:
            files.append(write_tasks(self.root, self.tasks))
        if self.episodic:
            ordered = [self._episodes[k] for k in sorted(self._episodes)]
            files.append(
                write_parquet_file(self.root, episodes_path(0), episodes_table(self.spec, ordered))
            )
        files.append(write_info(self.root, self._info()))
        files.sort(key=lambda r: r.path)
        manifest = Manifest(
            num_samples=self.num_samples,
            fingerprint=compute_fingerprint(
                [s.sha256 for s in self._shards], self.content_options, files
            ),
            shards=tuple(self._shards),
            files=tuple(files),
            rejects=rejects or Rejects(),
            provenance=Provenance(self.source, self.content_options, __version__),
            encoding=self.encoding.name,
        )
        atomic_write_bytes(os.path.join(self.root, MANIFEST_PATH), manifest.dumps().encode())
        return manifest

    def _info(self) -> Info:
        episodes = len(self._episodes)
        has_video = any(f.dtype == "video" for f in self.spec)
        return Info(
            features=self.spec,
            total_frames=self.num_samples,
            total_episodes=episodes,
            total_tasks=len(self.tasks),
            fps=self.fps,
            robot_type=self.robot_type,
            splits={"train": f"0:{episodes if self.episodic else self.num_samples}"},
            data_path=self.encoding_template(),
            video_path=DEFAULT_VIDEO_PATH if has_video else None,
            data_files_size_in_mb=max(1, round(self.target_shard_bytes / 10**6)),
        )


def _valid_values(
    column: pa.ChunkedArray, feature: Feature
) -> tuple[np.ndarray, np.ndarray | None]:
    """Non-null values for stats, and the row positions they came from (None when no nulls)."""
    if column.null_count == 0:
        return column_to_numpy(column, feature), None
    valid = column.is_valid().to_numpy(zero_copy_only=False)
    return column_to_numpy(column.filter(valid), feature), np.flatnonzero(valid)


def _rows(values: np.ndarray, positions: np.ndarray | None, a: int, b: int) -> np.ndarray:
    """The values of rows ``[a, b)``, skipping null rows."""
    if positions is None:
        return values[a:b]
    return values[np.searchsorted(positions, a) : np.searchsorted(positions, b)]


def _integer(feature: Feature) -> bool:
    return feature.dtype.startswith(("int", "uint")) or feature.dtype == "bool"


def plan_shard_cuts(table: pa.Table, target_shard_bytes: int, episodic: bool) -> list[int]:
    """Row boundaries of size-balanced shards; episodes (runs of ``episode_index``) are never split."""
    sizes = table_row_bytes(table)
    if not episodic or table.num_rows == 0:
        return contiguous_cuts(sizes, num_parts_for(int(sizes.sum()), target_shard_bytes))
    episode_ids = table.column("episode_index").to_numpy()
    starts = np.flatnonzero(np.r_[True, episode_ids[1:] != episode_ids[:-1]])
    episode_sizes = np.add.reduceat(sizes, starts)
    cuts = contiguous_cuts(episode_sizes, num_parts_for(int(sizes.sum()), target_shard_bytes))
    row_starts = np.r_[starts, table.num_rows]
    return [int(row_starts[c]) for c in cuts]


def write_dataset(
    path: str | os.PathLike[str],
    features: FeatureSpec | Mapping[str, Any] | Sequence[Feature],
    data: TableLike,
    *,
    target_shard_size: int | str = DEFAULT_TARGET_SHARD_BYTES,
    row_group_size: int | str = DEFAULT_ROW_GROUP_BYTES,
    tasks: Sequence[str] = (),
    fps: int | float = 0,
    robot_type: str | None = None,
    source: str = "",
    content_options: Mapping[str, Any] | None = None,
    rejects: Rejects | None = None,
    overwrite: bool = False,
) -> Manifest:
    """Write ``data`` (rows in final order) as a complete dataset with size-balanced shards.

    ``target_shard_size`` and ``row_group_size`` are payload bytes (ints or strings like ``'100MB'``).
    The data is held in memory; the Beam pipeline is the tool for corpora that are not.
    """
    target = parse_size(target_shard_size)
    writer = DatasetWriter(
        os.fspath(path),
        features,
        tasks=tasks,
        fps=fps,
        robot_type=robot_type,
        target_shard_bytes=target,
        row_group_bytes=parse_size(row_group_size),
        source=source,
        content_options={
            "target_shard_size": target,
            "row_group_size": parse_size(row_group_size),
            **(content_options or {}),
        },
        overwrite=overwrite,
    )
    table = (
        to_table(data, writer.spec)
        if not isinstance(data, pa.Table)
        else conform(data, writer.spec)
    )
    cuts = plan_shard_cuts(table, target, writer.episodic)
    for a, b in itertools.pairwise(cuts):
        writer.add_shard(table.slice(a, b - a))
    return writer.finalize(rejects)
