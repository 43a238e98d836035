"""Work files of a conversion: each source file's unit references and bucket totals, as Arrow IPC.

The scan stage writes one unit table per source file; the driver reads only the small totals tables
to plan; the write stage reads unit tables back. Locators are stored as JSON text (they are small).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from shardfeed.formats.sources.base import UnitRef
from shardfeed.formats.store_path import StorePath

UNIT_SUFFIX = ".arrow"  # Arrow IPC files under the work dir's units/ and totals/
UNIT_SCHEMA = pa.schema(
    [
        ("file", pa.string()),
        ("position", pa.int64()),
        ("rows", pa.int64()),
        ("payload_bytes", pa.int64()),
        ("content_hash", pa.string()),
        ("locator", pa.string()),
        ("key", pa.uint64()),
        ("bucket", pa.uint64()),
        # the unit's rows are in its file's spool (formats/spool.py), not read from the source
        ("spooled", pa.bool_()),
    ]
)
TOTALS_SCHEMA = pa.schema(
    [("bucket", pa.uint64()), ("units", pa.int64()), ("rows", pa.int64()), ("bytes", pa.int64())]
)


@dataclass(frozen=True)
class KeyedUnit:
    """A unit reference with its shuffle key and bucket (both stable across runs)."""

    key: int
    bucket: int
    ref: UnitRef

    def sort_key(self) -> tuple[int, str, int]:
        return (self.key, self.ref.file, self.ref.position)

    def to_tuple(self) -> tuple:
        """Plain ints, strings and tuples: Beam's primitive coder encodes these without pickling
        (a dataclass costs one pickle per unit at every shuffle)."""
        r = self.ref
        return (
            self.key,
            self.bucket,
            r.file,
            r.position,
            r.rows,
            r.payload_bytes,
            r.content_hash,
            r.locator,
        )

    @classmethod
    def from_tuple(cls, values: Sequence) -> KeyedUnit:
        key, bucket, file, position, rows, payload, digest, locator = values
        return cls(key, bucket, UnitRef(file, position, rows, payload, digest, tuple(locator)))


def work_part(work: StorePath, kind: str, source_file: str, suffix: str) -> StorePath:
    """Work path of one source file's part (``units``, ``totals``, ``rejects``, ``infer``), named
    by the blake2b-96 digest of its root-relative path, as reject files are."""
    name = hashlib.blake2b(source_file.encode(), digest_size=12).hexdigest()
    return work / kind / (name + suffix)


def unit_table(
    file: str,
    positions: np.ndarray,
    rows: np.ndarray,
    payload: np.ndarray,
    hashes: Sequence[str],
    locators: pa.Array | Sequence[str],
    keys: np.ndarray,
    buckets: np.ndarray,
    spooled: bool,
) -> pa.Table:
    """One source file's units as a ``UNIT_SCHEMA`` table in source order (by position), built
    from arrays: ``locators`` are JSON texts (``locator_texts``, or ``row_locators`` for
    ``spooled`` units)."""
    positions = np.asarray(positions, dtype=np.int64)
    order = np.argsort(positions, kind="stable")
    n = len(positions)
    names = pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, np.int32)), pa.array([file]))
    table = pa.table(
        [
            names.cast(pa.string()),
            pa.array(positions),
            pa.array(np.asarray(rows, dtype=np.int64)),
            pa.array(np.asarray(payload, dtype=np.int64)),
            pa.array(hashes, pa.string()),
            pa.array(locators, pa.string()) if not isinstance(locators, pa.Array) else locators,
            pa.array(np.asarray(keys, dtype=np.uint64)),
            pa.array(np.asarray(buckets, dtype=np.uint64)),
            pa.array(np.full(n, spooled, dtype=bool)),
        ],
        schema=UNIT_SCHEMA,
    )
    if n and not np.all(order[:-1] < order[1:]):  # a source that reported out of order
        table = table.take(pa.array(order))
    return table


def locator_texts(locators: Sequence[Sequence]) -> list[str]:
    """Locators (JSON-able tuples) as the JSON texts a unit table stores."""
    return [json.dumps(list(locator), separators=(",", ":")) for locator in locators]


def row_locators(spools: np.ndarray, starts: np.ndarray) -> pa.Array:
    """Locators ``[spool, start]`` (a unit's spool, by its id among its file's spools, and its
    first row there) as JSON texts, vectorised."""
    ids = pa.array(np.asarray(spools, dtype=np.int64)).cast(pa.string())
    text = pa.array(np.asarray(starts, dtype=np.int64)).cast(pa.string())
    return pc.binary_join_element_wise("[", ids, ",", text, "]", "")


def spool_starts(table: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """(pieces, first rows) of units whose locators ``row_locators`` wrote."""
    inner = pc.utf8_slice_codeunits(table.column("locator"), 1, -1)
    parts = pc.split_pattern(inner, ",", max_splits=1).combine_chunks()
    flat = pc.cast(parts.flatten(), pa.int64()).to_numpy().reshape(-1, 2)
    return flat[:, 0], flat[:, 1]


def unit_refs(table: pa.Table) -> list[UnitRef]:
    """A unit table's rows as :class:`UnitRef` (for sources that read by reference)."""
    return [KeyedUnit.from_tuple(values).ref for values in _unit_tuples(table)]


def write_unit_table(path: StorePath, table: pa.Table) -> None:
    """Write a ``UNIT_SCHEMA`` table (source order), atomically."""
    if table.schema != UNIT_SCHEMA:
        raise ValueError(f"{path}: unit table schema {table.schema} is not {UNIT_SCHEMA}")
    _write(path, table)


def read_unit_tuples(path: StorePath) -> list[tuple]:
    """A file's units as ``KeyedUnit.to_tuple()`` values, in source order, without building
    objects."""
    return _unit_tuples(_read(path, UNIT_SCHEMA))


def read_unit_table(path: StorePath) -> pa.Table:
    """A file's unit table as ``write_unit_table`` wrote it (``UNIT_SCHEMA``, source order)."""
    return _read(path, UNIT_SCHEMA)


def write_unit_groups(path: StorePath, table: pa.Table, groups: Sequence[np.ndarray]) -> None:
    """Write the rows of unit table ``table`` as one record batch per group of row numbers (in
    the given order), so ``read_unit_group`` reads one group without the others. One take puts
    the rows in group order, each group is a slice of it, and the buffers are not compressed:
    the file is scratch, read once a group at a time (at 64 shards, zstd per small batch cost
    more than it saved)."""
    if not groups:
        raise ValueError(f"{path}: no groups")
    order = np.concatenate(groups)
    (rows,) = table.take(pa.array(order, pa.int64())).combine_chunks().to_batches()
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, UNIT_SCHEMA) as writer:
        start = 0
        for group in groups:  # groups are never empty
            writer.write_batch(rows.slice(start, len(group)))
            start += len(group)
    path.write_bytes(sink.getvalue())  # scratch: a re-run redoes it


def read_unit_group(path: StorePath, group: int) -> pa.Table:
    """Group ``group`` of a ``write_unit_groups`` file, as a ``UNIT_SCHEMA`` table."""
    with path.open_input() as source:
        reader = pa.ipc.open_file(source)
        if reader.schema != UNIT_SCHEMA:
            raise ValueError(f"{path}: unexpected schema {reader.schema}")
        batch = reader.get_batch(group)
    return pa.Table.from_batches([batch])


def _unit_tuples(table: pa.Table) -> list[tuple]:
    cols = {name: table.column(name).to_pylist() for name in UNIT_SCHEMA.names}
    locators = [tuple(json.loads(text)) for text in cols["locator"]]
    return list(
        zip(
            cols["key"],
            cols["bucket"],
            cols["file"],
            cols["position"],
            cols["rows"],
            cols["payload_bytes"],
            cols["content_hash"],
            locators,
            strict=True,
        )
    )


def read_unit_sizes(path: StorePath) -> tuple[np.ndarray, np.ndarray]:
    """(payload bytes, rows) of a file's units, in source order."""
    table = _read(path, UNIT_SCHEMA)
    return table.column("payload_bytes").to_numpy(), table.column("rows").to_numpy()


def write_totals(path: StorePath, units: pa.Table) -> None:
    """Per-bucket (units, rows, bytes) of one file's unit table, sorted by bucket."""
    buckets = units.column("bucket").to_numpy()
    rows = units.column("rows").to_numpy()
    sizes = units.column("payload_bytes").to_numpy()
    ids, inverse = np.unique(buckets, return_inverse=True)
    table = pa.table(
        [
            pa.array(ids, pa.uint64()),
            pa.array(np.bincount(inverse, minlength=len(ids)).astype(np.int64)),
            pa.array(_exact_sums(inverse, rows, len(ids))),
            pa.array(_exact_sums(inverse, sizes, len(ids))),
        ],
        schema=TOTALS_SCHEMA,
    )
    _write(path, table)


def read_totals(path: StorePath) -> pa.Table:
    return _read(path, TOTALS_SCHEMA)


def _exact_sums(groups: np.ndarray, values: np.ndarray, n: int) -> np.ndarray:
    """Integer group sums (bincount's float weights would round above 2**53)."""
    out = np.zeros(n, dtype=np.int64)
    np.add.at(out, groups, values)
    return out


def _write(path: StorePath, table: pa.Table) -> None:
    # Arrow IPC with zstd buffers: as small as zstd Parquet (about 40 bytes per unit) and 5-40x
    # faster to write and read back, for scratch tables that are read once
    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression="zstd")
    with pa.ipc.new_file(sink, table.schema, options=options) as writer:
        writer.write_table(table)
    path.write_bytes(sink.getvalue())  # scratch, not fsynced: a re-run rescans


def _read(path: StorePath, schema: pa.Schema) -> pa.Table:
    with path.open_input() as source:  # read into memory: no mapping outlives the file
        table = pa.ipc.open_file(source).read_all()
    if table.schema != schema:
        raise ValueError(f"{path}: unexpected schema {table.schema}")
    return table
