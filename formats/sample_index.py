"""The per-sample index, ``meta/shardfeed/samples.parquet``: each sample's payload bytes and cost.

Row ``i`` is the sample with global index ``i``. Column ``bytes`` is that row's ``table_row_bytes``
(the quantity whose per-shard sum is the shard record's ``payload_bytes``): planners balance
ranks on it without reading a payload. Column ``cost`` (datasets written since it existed) is the
row's cost of the manifest's ``cost.kind`` (``formats/cost.py``): size-aware batching packs batches
under a budget of it. The file is written at conversion, just before the manifest, which lists it
in ``files``. Column ``record_offset`` (record-framed shards such as TFRecord only) is the byte
offset of the sample's record within its shard's uncompressed stream: random access and
reader-side splitting need no scan of the shard.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from shardfeed.formats.atomic import atomic_open
from shardfeed.formats.meta_writer import file_record
from shardfeed.formats.reader import Dataset, load_manifest
from shardfeed.formats.storage import Location, locate
from shardfeed.schemas.errors import ShardfeedError
from shardfeed.schemas.manifest import SAMPLE_INDEX_PATH, FileRecord, Manifest

__all__ = [
    "ROW_GROUP_ROWS",
    "SampleCostMissingError",
    "SampleIndexError",
    "SampleIndexMissingError",
    "prefix_bytes",
    "read_record_offsets",
    "read_sample_bytes",
    "read_sample_cost",
    "stream_sample_index",
    "write_sample_index",
]

COLUMN = "bytes"
COST_COLUMN = "cost"
OFFSET_COLUMN = "record_offset"
ROW_GROUP_ROWS = 1 << 20  # rows per Parquet row group (4 MiB of uint32 before compression)
_UINT32_LIMIT = 1 << 32


class SampleIndexError(ShardfeedError):
    """``samples.parquet`` is unreadable or disagrees with the manifest."""


class SampleIndexMissingError(SampleIndexError):
    """The dataset has no ``samples.parquet`` (converted before the index existed)."""


class SampleCostMissingError(SampleIndexMissingError):
    """The dataset records no per-sample cost (converted before the ``cost`` column existed)."""


def write_sample_index(
    root: str,
    row_bytes: Sequence[np.ndarray],
    cost: Sequence[np.ndarray] | None = None,
    offsets: Sequence[np.ndarray] | None = None,
) -> FileRecord:
    """Write ``root/meta/shardfeed/samples.parquet`` from per-shard size arrays, in shard order,
    and, with ``cost``, per-shard cost arrays of the same lengths as a second column ``cost``
    (``offsets``: a ``record_offset`` column). The arrays in memory; :func:`stream_sample_index`
    takes them one shard at a time."""
    columns = {COLUMN: row_bytes, COST_COLUMN: cost, OFFSET_COLUMN: offsets}
    given = {name: arrays for name, arrays in columns.items() if arrays is not None}
    counts = {name: len(arrays) for name, arrays in given.items()}
    if len(set(counts.values())) > 1:
        raise ValueError(f"per-column shard counts differ: {counts}")

    def shards() -> Iterator[dict[str, np.ndarray]]:
        for i in range(counts[COLUMN]):
            yield {name: arrays[i] for name, arrays in given.items()}

    return stream_sample_index(root, list(given), shards).record


@dataclass(frozen=True)
class SampleIndexWritten:
    """What :func:`stream_sample_index` wrote: the file's record, and every ``stride``-th
    sample's cost (all of them up to :data:`COST_SAMPLE` samples; None without a cost column)."""

    record: FileRecord
    cost_sample: np.ndarray | None


COST_SAMPLE = 1 << 20  # samples whose costs the manifest's cost buckets are computed from


def stream_sample_index(
    root: str,
    names: Sequence[str],
    shards: Callable[[], Iterable[Mapping[str, np.ndarray]]],
) -> SampleIndexWritten:
    """Write ``samples.parquet`` holding at most one shard's arrays and one row group at a time.

    ``shards()`` yields, in shard order, each shard's ``{column: array}`` for the columns
    ``names`` (``bytes`` first); it is called twice: once to check the arrays and pick each
    column's type, once to write. Each column is ``uint32`` when every value is below 2**32,
    else ``uint64``; neither is nullable. Row groups hold exactly :data:`ROW_GROUP_ROWS` rows (the
    last fewer), so the bytes depend on the values alone, never on how they were split into
    shards. Written atomically, zstd."""
    if not names or names[0] != COLUMN:
        raise ValueError(f"the columns must start with {COLUMN!r}, got {list(names)}")
    wide = dict.fromkeys(names, False)
    total = 0
    for shard in shards():
        arrays = _checked(shard, names)
        for name, array in arrays.items():
            wide[name] = wide[name] or bool(array.size and int(array.max()) >= _UINT32_LIMIT)
        total += len(arrays[COLUMN])
    dtypes = {name: np.uint64 if wide[name] else np.uint32 for name in names}
    schema = pa.schema(
        [pa.field(n, pa.from_numpy_dtype(d), nullable=False) for n, d in dtypes.items()]
    )
    stride = max(1, -(-total // COST_SAMPLE))
    sample: list[np.ndarray] = []
    seen = 0
    with (
        atomic_open(os.path.join(root, SAMPLE_INDEX_PATH)) as handle,
        pq.ParquetWriter(handle, schema, compression="zstd") as writer,
    ):
        for group in _row_groups(shards(), schema, dtypes, ROW_GROUP_ROWS):
            writer.write_table(group, row_group_size=ROW_GROUP_ROWS)
            if COST_COLUMN in names:
                costs = group.column(COST_COLUMN).to_numpy()
                sample.append(costs[(-seen) % stride :: stride].astype(np.int64))
            seen += group.num_rows
    if seen != total:
        raise ValueError(f"the shards gave {total} rows, then {seen}")
    cost_sample = None
    if COST_COLUMN in names:
        cost_sample = np.concatenate(sample) if sample else np.zeros(0, np.int64)
    return SampleIndexWritten(file_record(root, SAMPLE_INDEX_PATH), cost_sample)


def _checked(shard: Mapping[str, np.ndarray], names: Sequence[str]) -> dict[str, np.ndarray]:
    """One shard's arrays, flattened; every column present, of one length, and >= 0."""
    if set(shard) != set(names):
        raise ValueError(f"a shard has columns {sorted(shard)}, expected {sorted(names)}")
    arrays = {name: np.asarray(shard[name]).reshape(-1) for name in names}
    lengths = {name: len(array) for name, array in arrays.items()}
    if len(set(lengths.values())) > 1:
        raise ValueError(f"per-shard lengths differ: {lengths}")
    for name, array in arrays.items():
        if array.size and array.min() < 0:
            raise ValueError(f"{_WHAT[name]} must be >= 0")
    return arrays


_WHAT = {COLUMN: "sample sizes", COST_COLUMN: "sample costs", OFFSET_COLUMN: "record offsets"}


def _row_groups(
    shards: Iterable[Mapping[str, np.ndarray]],
    schema: pa.Schema,
    dtypes: Mapping[str, type],
    rows: int,
) -> Iterator[pa.Table]:
    """The concatenation of the shards' arrays cut into tables of ``schema`` of exactly ``rows``
    rows (the last fewer); holds at most one table plus one shard's arrays at a time."""
    names = schema.names
    pending: dict[str, list[np.ndarray]] = {name: [] for name in names}
    held = 0

    def table(columns: Mapping[str, np.ndarray]) -> pa.Table:
        return pa.table([pa.array(columns[name]) for name in names], schema=schema)

    for shard in shards:
        arrays = _checked(shard, names)
        for name in names:
            pending[name].append(arrays[name].astype(dtypes[name], copy=False))
        held += len(arrays[COLUMN])
        if held < rows:
            continue
        merged = {name: np.concatenate(pending[name]) for name in names}
        cut = held - held % rows
        for start in range(0, cut, rows):
            yield table({name: merged[name][start : start + rows] for name in names})
        pending = {name: [merged[name][cut:]] for name in names}
        held -= cut
    if held:
        yield table({name: np.concatenate(pending[name]) for name in names})


def read_sample_bytes(
    dataset: Dataset | Location | str | os.PathLike[str],
    manifest: Manifest | None = None,
    *,
    filesystem: pafs.FileSystem | None = None,
) -> np.ndarray:
    """Every sample's payload bytes, in global index order, as ``uint32`` or ``uint64``.

    ``dataset`` is an open :class:`Dataset`, a :class:`Location`, or a path or URI (reached with
    ``filesystem`` if given). ``manifest`` defaults to the dataset's own. The file must be listed
    in the manifest, match its size and sha256, hold ``num_samples`` rows, and sum per shard to
    each shard's ``payload_bytes``; otherwise a :class:`SampleIndexError` says which check failed
    (:class:`SampleIndexMissingError` when the dataset predates the index).
    """
    location, manifest = _manifest_of(dataset, manifest, filesystem)
    sizes = _read_column(location, manifest, COLUMN)
    _check_shard_sums(sizes, manifest, f"{location.display}/{SAMPLE_INDEX_PATH}")
    return sizes


def read_sample_cost(
    dataset: Dataset | Location | str | os.PathLike[str],
    manifest: Manifest | None = None,
    *,
    filesystem: pafs.FileSystem | None = None,
) -> np.ndarray:
    """Every sample's cost, in global index order, as ``uint32`` or ``uint64``; what it counts is
    the manifest's ``cost.kind`` (``tokens``, ``pixels``, ``frames`` or ``bytes``).

    Arguments and checks as :func:`read_sample_bytes` (file record, size, sha256, row count);
    :class:`SampleCostMissingError` when the dataset was converted before costs were recorded
    (no manifest ``cost`` and no ``cost`` column), :class:`SampleIndexError` when only one of
    the two is there.
    """
    location, manifest = _manifest_of(dataset, manifest, filesystem)
    if manifest.cost is None:
        raise SampleCostMissingError(
            f"{location.display}: the manifest records no per-sample cost; it was converted "
            "before costs existed; re-run shardfeed convert"
        )
    return _read_column(location, manifest, COST_COLUMN)


def read_record_offsets(
    dataset: Dataset | Location | str | os.PathLike[str],
    manifest: Manifest | None = None,
    *,
    filesystem: pafs.FileSystem | None = None,
) -> np.ndarray:
    """Every sample's record offset within its shard, in global index order (record-framed
    encodings only; checks as :func:`read_sample_bytes`)."""
    location, manifest = _manifest_of(dataset, manifest, filesystem)
    return _read_column(location, manifest, OFFSET_COLUMN)


def _read_column(location: Location, manifest: Manifest, column: str) -> np.ndarray:
    """One column of the index, after checking the file's record, size and sha256, the column's
    type and nulls, and its row count."""
    where = f"{location.display}/{SAMPLE_INDEX_PATH}"
    record = next((f for f in manifest.files if f.path == SAMPLE_INDEX_PATH), None)
    if record is None:
        raise SampleIndexMissingError(
            f"{location.display} has no {SAMPLE_INDEX_PATH}: it was converted before the sample "
            "index existed; re-run shardfeed convert"
        )
    data = _read(location, where)
    if len(data) != record.bytes or hashlib.sha256(data).hexdigest() != record.sha256:
        raise SampleIndexError(f"{where}: size or sha256 does not match the manifest")
    try:
        parquet = pq.ParquetFile(pa.BufferReader(data))
        names = parquet.schema_arrow.names
        table = parquet.read(columns=[column]) if column in names else None
    except (OSError, ValueError, pa.ArrowException) as err:
        raise SampleIndexError(f"{where}: unreadable ({err})") from None
    if table is None and column in (COST_COLUMN, OFFSET_COLUMN):
        why = "records a cost" if column == COST_COLUMN else f"has {manifest.encoding} shards"
        raise SampleIndexError(f"{where}: the manifest {why}, but there is no column {column!r}")
    column_type = table.schema.field(column).type if table is not None else None
    if column_type not in (pa.uint32(), pa.uint64()) or table.column(column).null_count:
        raise SampleIndexError(
            f"{where}: expected a non-null uint32 or uint64 column {column!r}, got "
            f"{parquet.schema_arrow}"
        )
    values = table.column(column).to_numpy()
    if len(values) != manifest.num_samples:
        raise SampleIndexError(
            f"{where}: {len(values)} rows, but the manifest has {manifest.num_samples} samples"
        )
    return values


def _manifest_of(
    dataset: Dataset | Location | str | os.PathLike[str],
    manifest: Manifest | None,
    filesystem: pafs.FileSystem | None,
) -> tuple[Location, Manifest]:
    if isinstance(dataset, Dataset):
        return dataset.location, manifest or dataset.manifest
    location = dataset if isinstance(dataset, Location) else locate(dataset, filesystem)
    return location, manifest or load_manifest(location)


def prefix_bytes(sizes: np.ndarray) -> np.ndarray:
    """Cumulative sizes as int64, length ``N + 1``: ``out[0] == 0`` and ``out[i]`` is the total
    payload of samples ``[0, i)``, so samples ``[a, b)`` weigh ``out[b] - out[a]`` bytes."""
    values = np.asarray(sizes).reshape(-1)
    out = np.zeros(len(values) + 1, dtype=np.int64)
    np.cumsum(values, dtype=np.int64, out=out[1:])
    return out


def _read(location: Location, where: str) -> bytes:
    try:
        return location.read_bytes(SAMPLE_INDEX_PATH)
    except (FileNotFoundError, OSError) as err:
        message = str(err).lower()
        if isinstance(err, FileNotFoundError) or "not found" in message or "no such" in message:
            raise SampleIndexError(
                f"{where}: listed in the manifest but missing; re-run shardfeed convert"
            ) from None
        raise


def _check_shard_sums(sizes: np.ndarray, manifest: Manifest, where: str) -> None:
    """Each shard's sizes must add up to its ``payload_bytes`` (one int64 prefix sum, no loop)."""
    if not manifest.shards:
        return
    prefix = prefix_bytes(sizes)
    starts = np.array([s.index_start for s in manifest.shards], dtype=np.int64)
    ends = np.array([s.index_end for s in manifest.shards], dtype=np.int64)
    expected = np.array([s.payload_bytes for s in manifest.shards], dtype=np.int64)
    bad = np.flatnonzero(prefix[ends] - prefix[starts] != expected)
    if bad.size:
        shard = manifest.shards[int(bad[0])]
        got = int(prefix[shard.index_end] - prefix[shard.index_start])
        raise SampleIndexError(
            f"{where}: sizes of {shard.path} sum to {got}, its payload_bytes is "
            f"{shard.payload_bytes} ({bad.size} shards disagree)"
        )
