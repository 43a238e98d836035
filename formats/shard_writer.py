"""Write one shard: byte-sized row groups, deterministic bytes, sha256 while writing, atomic publish."""

from __future__ import annotations

import hashlib
import itertools
import os
import queue
import threading
from dataclasses import dataclass
from typing import BinaryIO

import numpy as np
import pyarrow as pa

from shardfeed.formats.atomic import atomic_open
from shardfeed.formats.encoding import ShardEncoding, get_encoding
from shardfeed.formats.payload import table_row_bytes
from shardfeed.planning.partition import contiguous_cuts, num_parts_for
from shardfeed.schemas.features import FeatureSpec
from shardfeed.schemas.manifest import ShardRecord

DEFAULT_ROW_GROUP_BYTES = 4 << 20  # 4 MiB of payload: a few batches per group, cheap random access
#: bumped when the same rows and options give other shard bytes or another record, so a re-run
#: never keeps an interrupted run's shards written by an older writer (2: row-group CRC32Cs in
#: the footer, footer_sha256 in the record; 3: units ordered by the vectorised shuffle keys of
#: transforms.hashing.shuffle_keys; 4: image-folder units keyed by their path's digest, not their
#: bytes', unless --dedup; 5: the ``huggingface`` schema metadata, schemas/hf_features.py)
SHARD_WRITER_VERSION = 5
_QUEUED_CHUNKS = (
    16  # chunks the encoder may run ahead of the hashing thread (pyarrow writes ~1 MiB pages)
)


class _HashingSink:
    """A write-only file that hashes and counts every byte on its way to disk.

    Hashing and writing run on a background thread (both release the GIL), so they overlap the
    Parquet encoding instead of adding to it: about a third off a 100 MB shard's write. pyarrow
    may reuse a buffer once ``write`` returns, so each chunk is copied first. Call
    :meth:`finish` before closing the real file.
    """

    def __init__(self, raw: BinaryIO) -> None:
        self._raw = raw
        self.sha256 = hashlib.sha256()
        self.size = 0
        self.closed = False
        self._error: BaseException | None = None
        self._chunks: queue.Queue[bytes | None] = queue.Queue(maxsize=_QUEUED_CHUNKS)
        self._thread = threading.Thread(target=self._drain, name="shardfeed-sink", daemon=True)
        self._thread.start()

    def write(self, data) -> int:
        if self._error is not None:
            raise self._error
        chunk = bytes(data)
        self._chunks.put(chunk)
        self.size += len(chunk)
        return len(chunk)

    def _drain(self) -> None:
        while (chunk := self._chunks.get()) is not None:
            if self._error is None:
                try:
                    self.sha256.update(chunk)
                    self._raw.write(chunk)
                except BaseException as err:  # re-raised in the writing thread
                    self._error = err

    def finish(self) -> None:
        """Wait until every byte is hashed and handed to the file; raise a write error."""
        if self._thread.is_alive():
            self._chunks.put(None)
            self._thread.join()
        if self._error is not None:
            raise self._error

    def tell(self) -> int:
        return self.size

    def flush(self) -> None:
        pass  # the bytes may still be queued; finish() then atomic_open flush and fsync them

    def close(self) -> None:
        # the atomic_open context owns the real file; pyarrow's close must not end it early
        self.closed = True

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def readable(self) -> bool:
        return False


def row_group_cuts(
    table: pa.Table, row_group_bytes: int, row_bytes: np.ndarray | None = None
) -> list[int]:
    """Row boundaries giving row groups of about ``row_group_bytes`` payload each, balanced.

    ``row_bytes``: the table's ``table_row_bytes``, when the caller has them already."""
    sizes = _row_bytes(table, row_bytes)
    return contiguous_cuts(sizes, num_parts_for(int(sizes.sum()), row_group_bytes))


@dataclass(frozen=True)
class WrittenShard:
    """A written shard's manifest record and, for framed encodings, each row's record offset."""

    record: ShardRecord
    row_offsets: np.ndarray | None = None


def write_shard(
    root: str,
    rel_path: str,
    table: pa.Table,
    spec: FeatureSpec,
    *,
    index_start: int,
    row_group_bytes: int = DEFAULT_ROW_GROUP_BYTES,
    encoding: ShardEncoding | str = "parquet",
    row_bytes: np.ndarray | None = None,
) -> WrittenShard:
    """Write ``table`` (already in the spec's schema) to ``root/rel_path``; returns its record.

    ``row_bytes``: the table's ``table_row_bytes``, when the caller needs them too and has computed
    them once (``build_shard`` keeps them for the sample index); computed here otherwise.
    """
    if table.num_rows == 0:
        raise ValueError(f"{rel_path}: refusing to write an empty shard")
    codec = get_encoding(encoding) if isinstance(encoding, str) else encoding
    sizes = _row_bytes(table, row_bytes)
    cuts = row_group_cuts(table, row_group_bytes, sizes)
    # combine chunks so page boundaries never depend on how the caller's batches were cut
    groups = [table.slice(a, b - a).combine_chunks() for a, b in itertools.pairwise(cuts)]
    # the data is fsynced here, in parallel across writers; its directory once, by publish()
    with atomic_open(os.path.join(root, rel_path), sync_dir=False) as raw:
        sink = _HashingSink(raw)
        try:
            offsets = codec.write(sink, table.schema, groups, spec)
        finally:
            sink.finish()
    # read back from the page cache: a few KB, the only bytes a reader hashes when it opens it
    footer = codec.footer_sha256(os.path.join(root, rel_path))
    record = ShardRecord(
        path=rel_path,
        bytes=sink.size,
        payload_bytes=int(sizes.sum()),
        rows=table.num_rows,
        row_groups=tuple(g.num_rows for g in groups),
        sha256=sink.sha256.hexdigest(),
        index_start=index_start,
        index_end=index_start + table.num_rows,
        footer_sha256=footer,
    )
    return WrittenShard(record, None if offsets is None else np.asarray(offsets, dtype=np.int64))


def _row_bytes(table: pa.Table, row_bytes: np.ndarray | None) -> np.ndarray:
    if row_bytes is None:
        return table_row_bytes(table)
    if len(row_bytes) != table.num_rows:
        raise ValueError(f"{len(row_bytes)} row sizes for a table of {table.num_rows} rows")
    return row_bytes
