"""The fast reader: SoA numpy batches straight from whole row groups, located in O(log n).

``open_dataset`` refuses anything without a valid manifest, and every shard is checked against its
record (path safety, size, rows, row groups, schema; Parquet page CRCs on read) before a byte of it
is returned. Full sha256 checks are ``Dataset.verify()``.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import os
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs

from shardfeed.formats.columns import column_to_numpy
from shardfeed.formats.encoding import ShardFile, get_encoding
from shardfeed.formats.errors import CorruptShardError, IncompleteDatasetError
from shardfeed.formats.layout import INFO_PATH
from shardfeed.formats.storage import Location, locate
from shardfeed.schemas.errors import SchemaError
from shardfeed.schemas.features import FeatureSpec
from shardfeed.schemas.info import Info
from shardfeed.schemas.manifest import MANIFEST_PATH, Manifest, ShardRecord

Batch = dict[str, np.ndarray]
_ROW_GROUP_CACHE = 4  # decoded row groups kept for ds[i] and small reads


def load_manifest(location: Location) -> Manifest:
    """Parse the manifest strictly; a missing one means the dataset is not complete."""
    try:
        text = location.read_bytes(MANIFEST_PATH)
    except (FileNotFoundError, OSError) as err:
        if (
            isinstance(err, FileNotFoundError)
            or "not found" in str(err).lower()
            or "no such file" in str(err).lower()
        ):
            raise IncompleteDatasetError(
                f"{location.display}: no {MANIFEST_PATH}; not a complete shardfeed dataset (an interrupted job leaves none)"
            ) from None
        raise
    return Manifest.loads(text, source=f"{location.display}/{MANIFEST_PATH}")


class Dataset:
    """A read-only view of a published dataset. ``len(ds)``, ``ds[i]``, ``read``, ``take``, ``verify``."""

    def __init__(self, location: Location, manifest: Manifest, info: Info) -> None:
        self.location = location
        self.manifest = manifest
        self.info = info
        self.features: FeatureSpec = info.features
        self._encoding = get_encoding(manifest.encoding)
        self._starts = [s.index_start for s in manifest.shards]
        self._group_starts = [
            np.concatenate([[0], np.cumsum(s.row_groups)]).tolist() for s in manifest.shards
        ]
        self._files: dict[int, ShardFile] = {}
        self._handles: dict[int, Any] = {}
        self._cache: OrderedDict[tuple[int, int, tuple[str, ...]], pa.Table] = OrderedDict()
        self._schema = self.features.arrow_schema()

    # -- size and lookup -------------------------------------------------------------------------
    def __len__(self) -> int:
        return self.manifest.num_samples

    @property
    def shards(self) -> tuple[ShardRecord, ...]:
        return self.manifest.shards

    def locate(self, index: int) -> tuple[int, int, int]:
        """(shard, row group, row within group) of a global index, by two binary searches."""
        if not 0 <= index < len(self):
            raise IndexError(f"index {index} out of range for dataset of {len(self)} samples")
        shard = bisect.bisect_right(self._starts, index) - 1
        row = index - self._starts[shard]
        starts = self._group_starts[shard]
        group = bisect.bisect_right(starts, row) - 1
        return shard, group, row - starts[group]

    # -- reads -----------------------------------------------------------------------------------
    def __getitem__(self, index: int) -> dict[str, Any]:
        if index < 0:
            index += len(self)
        batch = self.read(index, index + 1)
        return {name: values[0] for name, values in batch.items()}

    def read(self, start: int, stop: int, columns: Sequence[str] | None = None) -> Batch:
        """Rows ``[start, stop)`` as a dict of numpy arrays (tensors as ``(N, *shape)``)."""
        names = self._columns(columns)
        start, stop = max(0, start), min(stop, len(self))
        if start >= stop:
            return self._to_numpy(self._schema.empty_table().select(names), names)
        tables = []
        shard = bisect.bisect_right(self._starts, start) - 1
        while shard < len(self.shards) and self._starts[shard] < stop:
            record = self.shards[shard]
            lo = max(start, record.index_start) - record.index_start
            hi = min(stop, record.index_end) - record.index_start
            tables.append(self._read_shard_rows(shard, lo, hi, names))
            shard += 1
        return self._to_numpy(pa.concat_tables(tables), names)

    def take(
        self, indices: Sequence[int] | np.ndarray, columns: Sequence[str] | None = None
    ) -> Batch:
        """Rows at ``indices`` (any order, repeats allowed); each needed row group is read once."""
        names = self._columns(columns)
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        if len(idx) == 0:
            return self._to_numpy(self._schema.empty_table().select(names), names)
        if idx.min() < -len(self) or idx.max() >= len(self):
            raise IndexError(f"indices out of range for dataset of {len(self)} samples")
        idx = np.where(idx < 0, idx + len(self), idx)
        order = np.argsort(idx, kind="stable")
        sorted_idx = idx[order]
        pieces = []
        shard_of = np.searchsorted(self._starts, sorted_idx, side="right") - 1
        for shard in np.unique(shard_of).tolist():
            rows = sorted_idx[shard_of == shard] - self._starts[shard]
            group_starts = np.asarray(self._group_starts[shard])
            group_of = np.searchsorted(group_starts, rows, side="right") - 1
            groups = np.unique(group_of).tolist()
            table = self._read_groups(shard, groups, names)
            # offsets of each needed group inside the concatenated table
            lengths = np.diff(group_starts)[groups]
            base = dict(
                zip(groups, np.concatenate([[0], np.cumsum(lengths)[:-1]]).tolist(), strict=True)
            )
            local = np.array([base[g] for g in group_of.tolist()]) + (rows - group_starts[group_of])
            pieces.append(table.take(pa.array(local)))
        table = pa.concat_tables(pieces)
        inverse = np.empty_like(order)
        inverse[order] = np.arange(len(order))
        return self._to_numpy(table.take(pa.array(inverse)), names)

    def iter_batches(
        self, batch_size: int, columns: Sequence[str] | None = None
    ) -> Iterator[Batch]:
        """Sequential batches over the whole dataset, in file order."""
        for start in range(0, len(self), batch_size):
            yield self.read(start, start + batch_size, columns)

    def verify(self, *, check_hashes: bool = True):
        """Recompute sha256, sizes and row counts of every listed file; see ``verify_dataset``."""
        from shardfeed.formats.verify import verify_location

        return verify_location(self.location, self.manifest, check_hashes=check_hashes)

    # -- internals -------------------------------------------------------------------------------
    def _columns(self, columns: Sequence[str] | None) -> list[str]:
        if columns is None:
            return list(self._schema.names)
        names = list(columns)
        unknown = [c for c in names if c not in self._schema.names]
        if unknown:
            raise KeyError(
                f"unknown or unstored columns {unknown}; stored columns are {self._schema.names}"
            )
        return names

    def _to_numpy(self, table: pa.Table, names: list[str]) -> Batch:
        return {name: column_to_numpy(table.column(name), self.features[name]) for name in names}

    def _read_shard_rows(self, shard: int, lo: int, hi: int, names: list[str]) -> pa.Table:
        starts = self._group_starts[shard]
        first = bisect.bisect_right(starts, lo) - 1
        last = bisect.bisect_right(starts, hi - 1) - 1
        if first == last:
            return self._group(shard, first, names).slice(lo - starts[first], hi - lo)
        # whole groups go through the small cache, so sequential reads decode each group once
        pieces = [self._group(shard, g, names) for g in range(first, last + 1)]
        return pa.concat_tables(pieces).slice(lo - starts[first], hi - lo)

    def _group(self, shard: int, group: int, names: list[str]) -> pa.Table:
        key = (shard, group, tuple(names))
        cached = self._cache.get(key)
        if cached is not None:
            self._cache.move_to_end(key)
            return cached
        table = self._read_groups(shard, [group], names)
        self._cache[key] = table
        if len(self._cache) > _ROW_GROUP_CACHE:
            self._cache.popitem(last=False)
        return table

    def _read_groups(self, shard: int, groups: list[int], names: list[str]) -> pa.Table:
        shard_file = self._open(shard)
        try:
            return shard_file.read_row_groups(groups, names)
        except (OSError, ValueError, pa.ArrowException) as err:
            raise CorruptShardError(
                f"{self.shards[shard].path}: cannot read row groups {groups}: {err}"
            ) from None

    def _open(self, shard: int) -> ShardFile:
        found = self._files.get(shard)
        if found is not None:
            return found
        record = self.shards[shard]
        field = f"shards[{shard}].path"
        info = self.location.info(record.path, field)
        if info.type == pafs.FileType.NotFound:
            raise CorruptShardError(f"{record.path}: shard is missing")
        if info.size != record.bytes:
            raise CorruptShardError(
                f"{record.path}: size {info.size} bytes, manifest says {record.bytes}"
            )
        if self.location.is_local:
            source: Any = self.location.path(record.path, field)
        else:
            source = self.location.open_input(record.path, field)
            self._handles[shard] = source
        try:
            shard_file = self._encoding.open(source)
        except (OSError, ValueError, pa.ArrowException) as err:
            raise CorruptShardError(f"{record.path}: unreadable shard footer: {err}") from None
        if (
            shard_file.num_rows != record.rows
            or tuple(shard_file.row_group_rows) != record.row_groups
        ):
            raise CorruptShardError(
                f"{record.path}: footer has {shard_file.num_rows} rows in groups {shard_file.row_group_rows[:8]}, "
                f"manifest says {record.rows} rows in groups {list(record.row_groups[:8])}"
            )
        schema = getattr(shard_file, "schema", None)
        if schema is not None and not schema.remove_metadata().equals(self._schema):
            raise CorruptShardError(f"{record.path}: schema does not match meta/info.json features")
        self._files[shard] = shard_file
        return shard_file

    def close(self) -> None:
        for handle in self._handles.values():
            handle.close()
        self._handles.clear()
        self._files.clear()
        self._cache.clear()

    def __enter__(self) -> Dataset:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Dataset({self.location.display!r}, samples={len(self)}, shards={len(self.shards)})"


def open_dataset(
    path: str | os.PathLike[str], *, filesystem: pafs.FileSystem | None = None
) -> Dataset:
    """Open a published dataset (local path or URI such as ``s3://bucket/ds``).

    Refuses a directory with no valid manifest, a manifest path that escapes the root (``..``,
    absolute, or a symlink out), and an ``info.json`` that disagrees with the manifest.
    """
    location = locate(path, filesystem)
    manifest = load_manifest(location)
    info_record = next((f for f in manifest.files if f.path == INFO_PATH), None)
    if info_record is None:
        raise SchemaError(
            "files",
            f"the manifest does not list {INFO_PATH}",
            source=f"{location.display}/{MANIFEST_PATH}",
        )
    for i, record in enumerate(manifest.shards):
        location.path(record.path, f"shards[{i}].path")  # refuse escapes before any read
    try:
        info_bytes = location.read_bytes(INFO_PATH)
    except FileNotFoundError:
        raise IncompleteDatasetError(f"{location.display}: {INFO_PATH} is missing") from None
    if hashlib.sha256(info_bytes).hexdigest() != info_record.sha256:
        raise CorruptShardError(f"{INFO_PATH}: sha256 does not match the manifest")
    info = Info.from_json(_json(info_bytes, INFO_PATH), source=f"{location.display}/{INFO_PATH}")
    if info.total_frames != manifest.num_samples:
        raise SchemaError(
            "total_frames",
            f"{info.total_frames} disagrees with the manifest's {manifest.num_samples} samples",
            source=INFO_PATH,
        )
    return Dataset(location, manifest, info)


def _json(data: bytes, source: str) -> Any:
    try:
        return json.loads(data)
    except ValueError as err:
        raise SchemaError("<root>", f"not valid JSON ({err})", source=source) from None
