"""Write one shard: byte-sized row groups, deterministic bytes, sha256 while writing, atomic publish."""

from __future__ import annotations

import hashlib
import itertools
import os
from typing import BinaryIO

import pyarrow as pa

from shardfeed.formats.atomic import atomic_open
from shardfeed.formats.encoding import ShardEncoding, get_encoding
from shardfeed.formats.payload import table_row_bytes
from shardfeed.planning.partition import contiguous_cuts, num_parts_for
from shardfeed.schemas.features import FeatureSpec
from shardfeed.schemas.manifest import ShardRecord

DEFAULT_ROW_GROUP_BYTES = 4 << 20  # 4 MiB of payload: a few batches per group, cheap random access


class _HashingSink:
    """A write-only file that hashes and counts every byte on its way to disk."""

    def __init__(self, raw: BinaryIO) -> None:
        self._raw = raw
        self.sha256 = hashlib.sha256()
        self.size = 0
        self.closed = False

    def write(self, data) -> int:
        view = memoryview(data)
        self.sha256.update(view)
        self._raw.write(view)
        self.size += view.nbytes
        return view.nbytes

    def tell(self) -> int:
        return self.size

    def flush(self) -> None:
        self._raw.flush()

    def close(self) -> None:
        # the atomic_open context owns the real file; pyarrow's close must not end it early
        self.closed = True

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def readable(self) -> bool:
        return False


def row_group_cuts(table: pa.Table, row_group_bytes: int) -> list[int]:
    """Row boundaries giving row groups of about ``row_group_bytes`` payload each, balanced."""
    sizes = table_row_bytes(table)
    return contiguous_cuts(sizes, num_parts_for(int(sizes.sum()), row_group_bytes))


def write_shard(
    root: str,
    rel_path: str,
    table: pa.Table,
    spec: FeatureSpec,
    *,
    index_start: int,
    row_group_bytes: int = DEFAULT_ROW_GROUP_BYTES,
    encoding: ShardEncoding | str = "parquet",
) -> ShardRecord:
    """Write ``table`` (already in the spec's schema) to ``root/rel_path`` and return its record."""
    if table.num_rows == 0:
        raise ValueError(f"{rel_path}: refusing to write an empty shard")
    codec = get_encoding(encoding) if isinstance(encoding, str) else encoding
    cuts = row_group_cuts(table, row_group_bytes)
    # combine chunks so page boundaries never depend on how the caller's batches were cut
    groups = [table.slice(a, b - a).combine_chunks() for a, b in itertools.pairwise(cuts)]
    with atomic_open(os.path.join(root, rel_path)) as raw:
        sink = _HashingSink(raw)
        codec.write(sink, table.schema, groups, spec)
    return ShardRecord(
        path=rel_path,
        bytes=sink.size,
        payload_bytes=int(table_row_bytes(table).sum()),
        rows=table.num_rows,
        row_groups=tuple(g.num_rows for g in groups),
        sha256=sink.sha256.hexdigest(),
        index_start=index_start,
        index_end=index_start + table.num_rows,
    )
