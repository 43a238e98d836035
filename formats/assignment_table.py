"""Read and write an assignment: the span table ``NAME.parquet`` and its header ``NAME.json``.

The table is sorted by ``(epoch, rank, worker, seq)`` and cut into small row groups, so a rank
reading its own spans touches only the row groups whose statistics can hold them. The header is
written last, after the table's sha256 is known: a table with no header is not an assignment.
"""

from __future__ import annotations

import hashlib
import io
import os
from collections.abc import Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from shardfeed.formats.atomic import atomic_write_bytes
from shardfeed.formats.errors import AssignmentError
from shardfeed.formats.storage import Location
from shardfeed.schemas.assignment import (
    COLUMNS,
    AssignmentHeader,
    TableRecord,
    header_path,
    table_path,
)

ROW_GROUP_ROWS = 1 << 16
SCHEMA = pa.schema(
    [
        pa.field("epoch", pa.int32(), nullable=False),
        pa.field("rank", pa.int32(), nullable=False),
        pa.field("worker", pa.int32(), nullable=False),
        pa.field("seq", pa.int32(), nullable=False),
        pa.field("shard", pa.int32(), nullable=False),
        pa.field("row_start", pa.int64(), nullable=False),
        pa.field("row_end", pa.int64(), nullable=False),
        # the span's shard is in its node's home shard set (a node-local read once staged)
        pa.field("home", pa.bool_(), nullable=False),
    ]
)
assert tuple(SCHEMA.names[: len(COLUMNS)]) == COLUMNS


def write_table(root: str, name: str, columns: Mapping[str, np.ndarray]) -> TableRecord:
    """Write the span table atomically and return its record for the header."""
    table = pa.table({f.name: pa.array(columns[f.name], f.type) for f in SCHEMA}, schema=SCHEMA)
    sink = io.BytesIO()
    pq.write_table(
        table,
        sink,
        row_group_size=ROW_GROUP_ROWS,
        compression="zstd",
        use_dictionary=["epoch", "rank", "worker", "home"],
        write_statistics=True,
    )
    data = sink.getvalue()
    rel = table_path(name)
    atomic_write_bytes(os.path.join(root, rel), data)
    return TableRecord(
        path=rel.rsplit("/", 1)[1],
        rows=table.num_rows,
        bytes=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
    )


def write_header(root: str, header: AssignmentHeader) -> None:
    atomic_write_bytes(os.path.join(root, header_path(header.name)), header.dumps().encode())


def read_header(location: Location, name: str) -> AssignmentHeader:
    rel = header_path(name)
    try:
        data = location.read_bytes(rel)
    except FileNotFoundError:
        raise AssignmentError(
            f"{location.display}: no assignment named {name!r} ({rel} is missing)"
        ) from None
    return AssignmentHeader.loads(data, f"{location.display}/{rel}")


def read_table(location: Location, header: AssignmentHeader, *, verify: bool = True) -> pa.Table:
    """The whole span table, checked against the header's size and sha256."""
    rel = table_path(header.name)
    try:
        data = location.read_bytes(rel)
    except FileNotFoundError:
        raise AssignmentError(f"{location.display}: {rel} is missing") from None
    if verify and (
        len(data) != header.table.bytes or hashlib.sha256(data).hexdigest() != header.table.sha256
    ):
        raise AssignmentError(
            f"{location.display}: {rel} does not match its header (size or sha256); "
            "it was modified or only partly written"
        )
    table = pq.read_table(pa.BufferReader(data))
    if table.schema.remove_metadata() != SCHEMA or table.num_rows != header.table.rows:
        raise AssignmentError(f"{location.display}: {rel} has an unexpected schema or rows")
    return table


def select(table: pa.Table, **equal: int) -> pa.Table:
    """Rows whose columns equal the given values, e.g. ``select(t, epoch=0, rank=3)``."""
    mask = None
    for column, value in equal.items():
        test = pc.equal(table.column(column), pa.scalar(value, pa.int32()))
        mask = test if mask is None else pc.and_(mask, test)
    return table if mask is None else table.filter(mask)
