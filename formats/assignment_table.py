"""Read and write an assignment: the span table ``NAME.parquet`` and its header ``NAME.json``.

The table is sorted by ``(epoch, rank, worker, seq)``. The header is written last, after the
table's sha256 is known (``formats/checked_table.py``): a table with no header is not an
assignment.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import numpy as np
import pyarrow as pa

from shardfeed.formats.atomic import atomic_write_bytes
from shardfeed.formats.checked_table import read_checked_table, write_checked_table
from shardfeed.formats.errors import AssignmentError
from shardfeed.formats.storage import Location
from shardfeed.schemas.assignment import COLUMNS, AssignmentHeader, header_path, table_path
from shardfeed.schemas.sidecar import TableRecord

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
    return write_checked_table(
        root, table_path(name), table, dictionary=["epoch", "rank", "worker", "home"]
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


def read_table(location: Location, header: AssignmentHeader) -> pa.Table:
    """The whole span table, checked against the header's size, sha256 and row count."""
    return read_checked_table(
        location, table_path(header.name), header.table, SCHEMA, AssignmentError
    )
