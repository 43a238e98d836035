"""The shard encoding, behind one small interface shared by writer and reader.

Parquet is the default and the LeRobot-compatible encoding. Another encoding (e.g. Arrow IPC, which
memory-maps faster) only has to implement :class:`ShardEncoding` and register in ``ENCODINGS``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import BinaryIO, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from shardfeed.formats.group_checksums import ChecksummingSink, GroupChecksums
from shardfeed.schemas.features import FeatureSpec
from shardfeed.schemas.hf_features import hf_schema_metadata

ZSTD_LEVEL = 3


@dataclass(frozen=True)
class ShardContext:
    """What a reader knows about a shard besides its bytes: its features, its manifest row
    groups, and (record-framed encodings) each row's record offset from the sample index."""

    spec: FeatureSpec | None  # None: only the framing is read (verify)
    row_groups: tuple[int, ...]
    offsets: np.ndarray | None = None


class ShardFile(Protocol):
    """An open shard: row-group layout plus a columnar read of whole row groups."""

    @property
    def num_rows(self) -> int: ...

    @property
    def row_group_rows(self) -> list[int]: ...

    def read_row_groups(
        self, indices: Sequence[int], columns: Sequence[str] | None
    ) -> pa.Table: ...

    def group_extent(self, index: int) -> tuple[int, int]:
        """Byte range ``[start, end)`` of the file that row group ``index`` lives in."""
        ...

    def footer_sha256(self) -> str | None:
        """sha256 of the bytes that describe the whole file (Parquet: its footer), which the
        manifest records; None for an encoding without such a footer."""
        ...


class ShardEncoding(Protocol):
    name: str
    extension: str
    #: one record per row (TFRecord): ``write`` returns each row's offset, ``open`` needs them
    framed: bool

    def write(
        self, sink: BinaryIO, schema: pa.Schema, groups: Iterable[pa.Table], spec: FeatureSpec
    ) -> np.ndarray | None:
        """Write each table of ``groups`` as exactly one row group; a framed encoding returns
        each row's record offset in the uncompressed stream."""

    def open(self, source: BinaryIO | str, context: ShardContext | None = None) -> ShardFile:
        """Open a local path or an open random-access file (``context``: framed encodings)."""

    def footer_sha256(self, path: str) -> str | None:
        """What :meth:`ShardFile.footer_sha256` gives for the local file ``path``, without
        opening it as a shard (the writer records it)."""


class _ParquetShardFile:
    def __init__(self, source) -> None:
        # a local path is memory-mapped; object stores pass an open pyarrow input file
        self._map = pa.memory_map(source) if isinstance(source, str) else None
        self._source = source
        handle = self._map if self._map is not None else source
        # the whole mapping as one zero-copy buffer: slices of it are thread-safe and copy
        # nothing (``read_at`` would copy each range into a new bytes object)
        self._bytes = self._map.read_buffer() if self._map is not None else None
        metadata = pq.read_metadata(handle)
        # every group's byte range, once: loaders ask for it before each read (read-ahead hints)
        self._extents = [_extent(metadata.row_group(g)) for g in range(metadata.num_row_groups)]
        # a local shard whose writer recorded row-group CRC32Cs is checked with those (fast,
        # and before decoding); otherwise, or on an object store, with Parquet's page CRCs
        self._checksums = None
        if self._map is not None:
            self._checksums = GroupChecksums.from_metadata(metadata.metadata, self._extents)
        self._file = pq.ParquetFile(
            handle,
            metadata=metadata,
            # coalescing reads pays on object stores; a memory map's reads are zero-copy slices
            pre_buffer=self._map is None,
            page_checksum_verification=self._checksums is None,
        )

    @property
    def num_rows(self) -> int:
        return self._file.metadata.num_rows

    @property
    def row_group_rows(self) -> list[int]:
        meta = self._file.metadata
        return [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]

    @property
    def schema(self) -> pa.Schema:
        return self._file.schema_arrow

    def group_extent(self, index: int) -> tuple[int, int]:
        return self._extents[index]

    def footer_sha256(self) -> str:
        return _footer_sha256(self._map if self._map is not None else self._source)

    def read_row_groups(self, indices: Sequence[int], columns: Sequence[str] | None) -> pa.Table:
        if self._checksums is not None:
            for g in indices:  # the whole range, whichever columns are read
                start, end = self._checksums.span(g)
                self._checksums.check(g, self._bytes.slice(start, end - start))
        # one row group is a loader's unit: its threads decode groups side by side already
        return self._file.read_row_groups(
            list(indices),
            columns=list(columns) if columns is not None else None,
            use_threads=len(indices) > 1,
        )


def _footer_sha256(handle: pa.NativeFile) -> str:
    """sha256 of a Parquet file's footer: its metadata, the metadata's 4-byte length and the
    closing ``PAR1`` (positional reads only, so a shared handle needs no seek)."""
    size = handle.size()
    tail = handle.read_at(8, size - 8) if size >= 12 else b""
    if len(tail) != 8 or tail[4:] != b"PAR1":
        raise OSError(f"not a Parquet file: no closing magic in its last {min(size, 8)} bytes")
    length = int.from_bytes(tail[:4], "little") + 8
    if length > size - 4:
        raise OSError(f"Parquet footer of {length - 8} bytes does not fit in {size} bytes")
    return hashlib.sha256(handle.read_at(length, size - length)).hexdigest()


def _extent(group: pq.RowGroupMetaData) -> tuple[int, int]:
    """Byte range ``[start, end)`` of a row group's column chunks, from the footer."""
    start, end = None, 0
    for i in range(group.num_columns):
        chunk = group.column(i)
        first = chunk.data_page_offset
        if chunk.has_dictionary_page and chunk.dictionary_page_offset is not None:
            first = min(first, chunk.dictionary_page_offset)
        start = first if start is None else min(start, first)
        end = max(end, first + chunk.total_compressed_size)
    return (start or 0), end


class ParquetEncoding:
    """zstd on numeric and text columns, no second compression of encoded media, page index on."""

    name = "parquet"
    extension = ".parquet"
    framed = False

    def write(
        self, sink: BinaryIO, schema: pa.Schema, groups: Iterable[pa.Table], spec: FeatureSpec
    ) -> None:
        compression, no_dictionary = self._column_options(spec)
        # the features Hugging Face datasets reads (Image, ClassLabel, ...); the key lands in the
        # footer's ARROW:schema, where pyarrow and so datasets find it
        schema = schema.with_metadata(hf_schema_metadata(spec))
        checksummed = ChecksummingSink(sink)
        with pq.ParquetWriter(
            checksummed,
            schema,
            compression=compression,
            compression_level={
                col: ZSTD_LEVEL for col, codec in compression.items() if codec == "zstd"
            },
            use_dictionary=[c for c in _leaf_paths(schema) if c not in no_dictionary],
            write_statistics=True,
            write_page_index=True,
            write_page_checksum=True,
            store_schema=True,
        ) as writer:
            for table in groups:
                # one call per planned group; a row_group_size >= len keeps it one row group,
                # written out in full before the call returns (so a mark ends its range)
                writer.write_table(table, row_group_size=max(1, table.num_rows))
                checksummed.mark()
            writer.add_key_value_metadata(checksummed.metadata())

    def open(self, source, context: ShardContext | None = None) -> ShardFile:
        return _ParquetShardFile(source)

    def footer_sha256(self, path: str) -> str:
        with pa.OSFile(path) as handle:
            return _footer_sha256(handle)

    @staticmethod
    def _column_options(spec: FeatureSpec) -> tuple[dict[str, str], set[str]]:
        compression: dict[str, str] = {}
        no_dictionary: set[str] = set()
        for feature in spec.stored:
            for leaf in _leaf_paths(pa.schema([pa.field(feature.name, feature.arrow_type)])):
                media = feature.dtype == "image" and leaf.endswith(".bytes")
                compression[leaf] = "none" if media else "zstd"
                if media or feature.is_tensor or feature.dtype in ("float16", "float32", "float64"):
                    no_dictionary.add(
                        leaf
                    )  # dictionaries rarely pay for floats and never for media
        return compression, no_dictionary


def _leaf_paths(schema: pa.Schema) -> list[str]:
    """Parquet leaf column paths ('a.list.element', 'img.bytes') as the writer names them."""
    paths: list[str] = []

    def walk(prefix: str, atype: pa.DataType) -> None:
        if pa.types.is_struct(atype):
            for i in range(atype.num_fields):
                walk(f"{prefix}.{atype.field(i).name}", atype.field(i).type)
        elif (
            pa.types.is_list(atype)
            or pa.types.is_fixed_size_list(atype)
            or pa.types.is_large_list(atype)
        ):
            walk(f"{prefix}.list.element", atype.value_type)  # compliant nested naming
        else:
            paths.append(prefix)

    for field in schema:
        walk(field.name, field.type)
    return paths


ENCODINGS: dict[str, ShardEncoding] = {"parquet": ParquetEncoding()}
#: encodings built on first use: name -> compression of the TFRecord encoding
_TFRECORD = {"tfrecord": None, "tfrecord-gzip": "gzip"}


def get_encoding(name: str) -> ShardEncoding:
    if name in _TFRECORD and name not in ENCODINGS:
        from shardfeed.formats.tfrecord_shards import TFRecordEncoding

        ENCODINGS[name] = TFRecordEncoding(_TFRECORD[name])
    try:
        return ENCODINGS[name]
    except KeyError:
        raise ValueError(
            f"unknown shard encoding {name!r}; expected one of {sorted([*ENCODINGS, *_TFRECORD])}"
        ) from None
