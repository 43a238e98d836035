"""Assemble a dataset: shards in order, then LeRobot metadata, then the manifest, last.

``DatasetWriter`` is the incremental API (one shard at a time, in plan order); ``write_dataset`` is
the one-call Python API for data that fits in memory. Both are thin loops over ``formats.publish``.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from shardfeed.formats.columns import TableLike, conform, to_table
from shardfeed.formats.cost import resolve_cost_kind
from shardfeed.formats.payload import table_row_bytes
from shardfeed.formats.publish import (
    DEFAULT_TARGET_SHARD_BYTES,
    DatasetExistsError,
    DatasetOptions,
    ShardOutcome,
    build_shard,
    prepare_root,
    publish,
)
from shardfeed.formats.shard_writer import DEFAULT_ROW_GROUP_BYTES
from shardfeed.planning.partition import contiguous_cuts, num_parts_for
from shardfeed.schemas.errors import ShardfeedError
from shardfeed.schemas.features import Feature, FeatureSpec
from shardfeed.schemas.manifest import Manifest, Rejects, ShardRecord
from shardfeed.schemas.units import parse_size

__all__ = [
    "DEFAULT_TARGET_SHARD_BYTES",
    "DatasetExistsError",
    "DatasetWriter",
    "plan_shard_cuts",
    "write_dataset",
]


class DatasetWriter:
    """Write shards in plan order, then ``finalize()`` writes metadata and, last, the manifest.

    A dataset is episodic when its features include ``episode_index``: then an episode must sit in
    one shard, ``index`` (if present) must run 0..N-1 in file order, and ``meta/episodes`` is written.
    ``cost``: what the per-sample cost in ``samples.parquet`` counts (``formats/cost.py``).
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
        cost: str = "auto",
        overwrite: bool = False,
    ) -> None:
        self.root = os.fspath(root)
        self.spec = features if isinstance(features, FeatureSpec) else FeatureSpec.of(features)
        self.options = DatasetOptions(
            tasks=tuple(tasks),
            fps=fps,
            robot_type=robot_type,
            target_shard_bytes=target_shard_bytes,
            row_group_bytes=row_group_bytes,
            encoding=encoding,
            source=source,
            content_options=dict(content_options or {}),
            cost=cost,
        )
        self.episodic = "episode_index" in self.spec
        resolve_cost_kind(self.spec, cost)  # refuse a kind the features cannot give, up front
        self._outcomes: list[ShardOutcome] = []
        self._episodes: set[int] = set()
        prepare_root(self.root, overwrite)

    @property
    def num_samples(self) -> int:
        return self._outcomes[-1].record.index_end if self._outcomes else 0

    def add_shard(self, data: TableLike) -> ShardRecord:
        """Write the next shard (rows in final order) and fold its stats and episodes in."""
        schema = self.spec.arrow_schema()
        table = (
            data
            if isinstance(data, pa.Table) and data.schema == schema
            else to_table(data, self.spec)
        )
        outcome = build_shard(
            self.root,
            len(self._outcomes),
            table,
            self.spec,
            self.options,
            index_start=self.num_samples,
        )
        for episode in outcome.episodes:
            if episode.episode_index in self._episodes:
                raise ShardfeedError(
                    f"episode {episode.episode_index} is split (rows from {episode.dataset_from_index} in shard "
                    f"{outcome.number} and earlier); an episode must be contiguous in one shard"
                )
            self._episodes.add(episode.episode_index)
        self._outcomes.append(outcome)
        return outcome.record

    def finalize(self, rejects: Rejects | None = None) -> Manifest:
        """Write stats, tasks, episodes and info, then the manifest (last); return the manifest."""
        return publish(self.root, self.spec, self._outcomes, self.options, rejects=rejects)


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
    cost: str = "auto",
    encoding: str = "parquet",
    overwrite: bool = False,
) -> Manifest:
    """Write ``data`` (rows in final order) as a complete dataset with size-balanced shards.

    ``target_shard_size`` and ``row_group_size`` are payload bytes (ints or strings like ``'100MB'``).
    ``cost`` is what each sample's cost in ``samples.parquet`` counts: ``auto`` (from the feature
    types), ``tokens``, ``pixels``, ``frames`` or ``bytes`` (see ``formats/cost.py``).
    ``encoding``: ``parquet`` (LeRobot v3.0) or ``tfrecord``/``tfrecord-gzip`` (FORMAT.md §16).
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
        cost=cost,
        encoding=encoding,
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
