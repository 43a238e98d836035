"""Parquet tables that a JSON header vouches for (size and sha256), written atomically.

Planners add such tables to a published dataset (assignments, the hot index, cache plans). The
table is written first and its header last, so a table without a header is never read, and a
table whose bytes differ from its header is refused.
"""

from __future__ import annotations

import hashlib
import io
import os

import pyarrow as pa
import pyarrow.parquet as pq

from shardfeed.formats.atomic import atomic_write_bytes
from shardfeed.formats.storage import Location
from shardfeed.schemas.errors import ShardfeedError
from shardfeed.schemas.sidecar import TableRecord

ROW_GROUP_ROWS = 1 << 16


def write_checked_table(
    root: str, rel: str, table: pa.Table, *, dictionary: list[str] | None = None
) -> TableRecord:
    """Write ``table`` to ``root/rel`` (zstd, small row groups, statistics on) and return its
    record for the header; ``path`` is the file name, relative to the header's folder."""
    sink = io.BytesIO()
    pq.write_table(
        table,
        sink,
        row_group_size=ROW_GROUP_ROWS,
        compression="zstd",
        use_dictionary=dictionary or False,
        write_statistics=True,
    )
    data = sink.getvalue()
    atomic_write_bytes(os.path.join(root, rel), data)
    return TableRecord(
        path=rel.rsplit("/", 1)[-1],
        rows=table.num_rows,
        bytes=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
    )


def read_checked_table(
    location: Location,
    rel: str,
    record: TableRecord,
    schema: pa.Schema,
    error: type[ShardfeedError] = ShardfeedError,
) -> pa.Table:
    """Read ``rel`` and refuse it (raising ``error``) unless its size, sha256, schema and row
    count match what its header says."""
    try:
        data = location.read_bytes(rel)
    except FileNotFoundError:
        raise error(f"{location.display}: {rel} is missing") from None
    if len(data) != record.bytes or hashlib.sha256(data).hexdigest() != record.sha256:
        raise error(
            f"{location.display}: {rel} does not match its header (size or sha256); "
            "it was modified or only partly written"
        )
    table = pq.read_table(pa.BufferReader(data))
    if table.schema.remove_metadata() != schema or table.num_rows != record.rows:
        raise error(f"{location.display}: {rel} has an unexpected schema or row count")
    return table
