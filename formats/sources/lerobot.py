"""Read a LeRobot v3.0 dataset in place: info, tasks, episodes metadata and data files, in file order.

Only reads; never trusts totals. ``inconsistencies()`` lists where ``info.json`` disagrees with the
data (real datasets do: a published Reachy2 subset claims 14,983 frames and holds 899).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from functools import cached_property

import pyarrow as pa
import pyarrow.parquet as pq

from shardfeed.formats.layout import INFO_PATH, TASKS_PATH
from shardfeed.schemas.errors import SchemaError, ShardfeedError
from shardfeed.schemas.info import Info
from shardfeed.schemas.paths import resolve_within


@dataclass(frozen=True)
class LeRobotV30Source:
    root: str
    info: Info

    @cached_property
    def data_files(self) -> list[str]:
        """Relative data file paths in LeRobot's order (chunk, then file), as its reader globs them."""
        return self._glob("data")

    @cached_property
    def episode_files(self) -> list[str]:
        return self._glob("meta/episodes")

    def _glob(self, directory: str) -> list[str]:
        base = os.path.join(self.root, directory)
        if not os.path.isdir(base):
            return []
        out = []
        for chunk in sorted(os.listdir(base)):
            chunk_dir = os.path.join(base, chunk)
            if os.path.isdir(chunk_dir):
                out += [
                    f"{directory}/{chunk}/{name}"
                    for name in sorted(os.listdir(chunk_dir))
                    if name.endswith(".parquet")
                ]
        return out

    def _path(self, rel: str) -> str:
        return resolve_within(self.root, rel, rel)

    @cached_property
    def tasks(self) -> list[str]:
        """Task strings ordered by task_index (the string is the pandas index, or a ``task`` column)."""
        table = pq.read_table(self._path(TASKS_PATH))
        name = "task" if "task" in table.column_names else "__index_level_0__"
        if name not in table.column_names or "task_index" not in table.column_names:
            raise SchemaError(
                TASKS_PATH,
                f"expected task_index and a task string column, found {table.column_names}",
            )
        pairs = sorted(
            zip(table.column("task_index").to_pylist(), table.column(name).to_pylist(), strict=True)
        )
        if [i for i, _ in pairs] != list(range(len(pairs))):
            raise SchemaError(f"{TASKS_PATH}.task_index", "task indices are not 0..n-1")
        return [task for _, task in pairs]

    def read_episodes(self) -> pa.Table:
        return (
            pa.concat_tables([pq.read_table(self._path(f)) for f in self.episode_files])
            if self.episode_files
            else pa.table({})
        )

    def read_data(self, columns: list[str] | None = None) -> pa.Table:
        """All data rows in file order (schema unified across files by Arrow's default promotion)."""
        if not self.data_files:
            raise ShardfeedError(f"{self.root}: no data/*/*.parquet files")
        tables = [pq.read_table(self._path(f), columns=columns) for f in self.data_files]
        return pa.concat_tables(
            [t.replace_schema_metadata(None) for t in tables], promote_options="default"
        )

    def inconsistencies(
        self, data: pa.Table | None = None, episodes: pa.Table | None = None
    ) -> list[str]:
        """Human-readable disagreements between info.json, episode metadata and the data."""
        data = data if data is not None else self.read_data(columns=["episode_index"])
        episodes = episodes if episodes is not None else self.read_episodes()
        problems = []
        if self.info.total_frames != data.num_rows:
            problems.append(
                f"info.json total_frames={self.info.total_frames} but the data has {data.num_rows} rows"
            )
        if self.info.total_episodes != episodes.num_rows:
            problems.append(
                f"info.json total_episodes={self.info.total_episodes} but meta/episodes has {episodes.num_rows} rows"
            )
        if self.info.total_tasks != len(self.tasks):
            problems.append(
                f"info.json total_tasks={self.info.total_tasks} but tasks.parquet has {len(self.tasks)}"
            )
        if episodes.num_rows and "length" in episodes.column_names:
            total = sum(episodes.column("length").to_pylist())
            if total != data.num_rows:
                problems.append(
                    f"episode lengths sum to {total} but the data has {data.num_rows} rows"
                )
        return problems


def open_lerobot_v30(path: str | os.PathLike[str]) -> LeRobotV30Source:
    """Open a LeRobot v3.0 dataset directory; info.json must parse strictly."""
    root = os.path.abspath(os.fspath(path))
    info_path = resolve_within(root, INFO_PATH, INFO_PATH)
    try:
        with open(info_path, encoding="utf-8") as handle:
            obj = json.load(handle)
    except FileNotFoundError:
        raise ShardfeedError(f"{root}: no {INFO_PATH}; not a LeRobot dataset") from None
    except ValueError as err:
        raise SchemaError("<root>", f"not valid JSON ({err})", source=info_path) from None
    return LeRobotV30Source(root, Info.from_json(obj, source=info_path))
