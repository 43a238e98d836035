"""TFRecord shards: one ``tf.train.Example`` per sample, as a :class:`ShardEncoding`.

Features map to Example features (FORMAT.md §16 gives the parse spec a TF user writes):

| feature | Example feature | values |
|---|---|---|
| float16/32/64, scalar or tensor | ``float_list`` | row-major; float64 is narrowed to float32 |
| bool, (u)int8-64, scalar or tensor | ``int64_list`` | row-major; uint64 as its int64 bit pattern |
| string | ``bytes_list`` | one UTF-8 value |
| image | ``bytes_list`` | one value: the encoded image bytes |

A null value leaves the feature out of that Example. Groups of rows are planned exactly as for
Parquet; a TFRecord file has no row groups of its own, so they are ranges of records, found by the
per-row record offsets in ``samples.parquet`` (column ``record_offset``). GZIP shards
(``tfrecord-gzip``) are one deterministic gzip member; they are read by decompressing the whole
shard once, since gzip has no random access.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import Any, BinaryIO

import numpy as np
import pyarrow as pa

from shardfeed.formats.columns import nest
from shardfeed.formats.encoding import ShardContext
from shardfeed.formats.tf_example import ExampleDecodeError, decode_example, encode_example
from shardfeed.formats.tfrecord import (
    FOOTER_BYTES,
    HEADER_BYTES,
    TFRecordError,
    TFRecordWriter,
    iter_records,
    masked_crc32c,
    sniff_compression,
)
from shardfeed.schemas.errors import ShardfeedError
from shardfeed.schemas.features import NUMERIC_DTYPES, Feature, FeatureSpec

_FLOATS = ("float16", "float32", "float64")


class TFRecordShardError(ShardfeedError, ValueError):
    """A TFRecord shard that does not match its record offsets or features."""


def example_kind(feature: Feature) -> str:
    """The Example list a feature is stored in: ``float``, ``int64`` or ``bytes``."""
    if feature.dtype in _FLOATS:
        return "float"
    if feature.dtype in NUMERIC_DTYPES:
        return "int64"
    return "bytes"


class TFRecordEncoding:
    """``tfrecord`` (plain) or ``tfrecord-gzip`` shards; see the module docstring."""

    framed = True

    def __init__(self, compression: str | None) -> None:
        self.compression = compression
        self.name = "tfrecord" if compression is None else "tfrecord-gzip"
        self.extension = ".tfrecord" if compression is None else ".tfrecord.gz"

    def write(
        self, sink: BinaryIO, schema: pa.Schema, groups: Iterable[pa.Table], spec: FeatureSpec
    ) -> np.ndarray:
        offsets: list[int] = []
        features = [spec[name] for name in schema.names]
        with TFRecordWriter(sink, compression=self.compression) as writer:
            for table in groups:
                rows = _row_values(table, features)
                for values in zip(*rows, strict=True):
                    example = {
                        f.name: (example_kind(f), v)
                        for f, v in zip(features, values, strict=True)
                        if v is not None
                    }
                    offsets.append(writer.write(encode_example(example)))
        return np.asarray(offsets, dtype=np.int64)

    def footer_sha256(self, path: str) -> None:
        """A TFRecord file has no footer: the reader hashes the whole shard when it opens it."""
        return None

    def open(self, source: Any, context: ShardContext | None = None) -> TFRecordShardFile:
        if context is None or context.offsets is None:
            raise TFRecordShardError("a TFRecord shard is opened with its record offsets")
        return TFRecordShardFile(source, context)


class TFRecordShardFile:
    """An open TFRecord shard: groups of rows are record ranges found by their offsets."""

    def __init__(self, source: Any, context: ShardContext) -> None:
        self.context = context
        self.offsets = np.asarray(context.offsets, dtype=np.int64)
        self._path = os.fspath(source) if isinstance(source, (str, os.PathLike)) else None
        self._handle = None if self._path is not None else source
        self._name = self._path or str(getattr(source, "path", "<tfrecord>"))
        self.size = self._file_size()
        self.compressed = sniff_compression(self._pread(0, 2)) == "gzip"
        self._stream: bytes | None = None  # a gzip shard, decompressed on first read
        self._starts = np.concatenate([[0], np.cumsum(context.row_groups)]).astype(np.int64)
        if self._starts[-1] != len(self.offsets):
            raise TFRecordShardError(
                f"{self._name}: {len(self.offsets)} record offsets for row groups "
                f"of {int(self._starts[-1])} rows"
            )
        if not self.compressed:
            self._check_end()

    # -- ShardFile -----------------------------------------------------------------------------
    @property
    def num_rows(self) -> int:
        return len(self.offsets)

    @property
    def row_group_rows(self) -> list[int]:
        return [int(n) for n in np.diff(self._starts)]

    def footer_sha256(self) -> None:
        return None

    def group_extent(self, index: int) -> tuple[int, int]:
        if self.compressed:
            return 0, 0  # read whole, once: nothing to page in per group
        return self._span(int(self._starts[index]), int(self._starts[index + 1]))

    def read_row_groups(self, indices: Sequence[int], columns: Sequence[str] | None) -> pa.Table:
        spec = self.context.spec
        if spec is None:
            raise TFRecordShardError("reading TFRecord values needs the dataset's features")
        names = list(columns) if columns is not None else [f.name for f in spec.stored]
        examples: list[dict] = []
        for g in indices:
            a, b = int(self._starts[g]), int(self._starts[g + 1])
            start, end = self._span(a, b)
            data = self._read_range(start, end)
            for offset in self.offsets[a:b]:
                examples.append(self._example(data, int(offset) - start, int(offset)))
        schema = pa.schema([spec.arrow_schema().field(n) for n in names])
        arrays = [_column(examples, spec[n]) for n in names]
        return pa.Table.from_arrays(arrays, schema=schema)

    def check_framing(self) -> list[str]:
        """Every record's CRCs, and record starts equal to the offsets (full read)."""
        problems: list[str] = []
        found: list[int] = []
        source = self._path if self._path is not None else self._reopen()
        for offset, _ in iter_records(source, on_error=lambda e: problems.append(str(e))):
            found.append(offset)
        if not problems and not np.array_equal(np.asarray(found, np.int64), self.offsets):
            problems.append(
                f"{len(found)} records found, at offsets that differ from the sample index's "
                f"{len(self.offsets)}"
            )
        return problems

    # -- internals -----------------------------------------------------------------------------
    def _span(self, a: int, b: int) -> tuple[int, int]:
        """Byte range of records ``[a, b)`` in the uncompressed stream."""
        start = int(self.offsets[a])
        end = int(self.offsets[b]) if b < len(self.offsets) else self._stream_size()
        return start, end

    def _stream_size(self) -> int:
        return len(self._decompressed()) if self.compressed else self.size

    def _example(self, data: bytes, at: int, offset: int) -> dict:
        head = data[at : at + HEADER_BYTES]
        if len(head) < HEADER_BYTES:
            raise TFRecordError(self._name, offset, "truncated", "record header past the group")
        length = int.from_bytes(head[:8], "little")
        if masked_crc32c(head[:8]) != int.from_bytes(head[8:12], "little"):
            raise TFRecordError(self._name, offset, "length crc", "no record starts here")
        body = data[at + HEADER_BYTES : at + HEADER_BYTES + length]
        crc = data[at + HEADER_BYTES + length : at + HEADER_BYTES + length + FOOTER_BYTES]
        if len(body) < length or len(crc) < FOOTER_BYTES:
            raise TFRecordError(self._name, offset, "truncated", "record past the group")
        if masked_crc32c(body) != int.from_bytes(crc, "little"):
            raise TFRecordError(self._name, offset, "data crc", "the data do not match")
        try:
            return decode_example(body)
        except ExampleDecodeError as err:
            raise TFRecordShardError(f"{self._name} at {offset}: {err}") from None

    def _read_range(self, start: int, end: int) -> bytes:
        if self.compressed:
            return self._decompressed()[start:end]
        return self._pread(start, end - start)

    def _decompressed(self) -> bytes:
        if self._stream is None:
            import gzip

            try:
                self._stream = gzip.decompress(self._pread(0, self.size))
            except (OSError, EOFError) as err:
                raise TFRecordError(self._name, 0, "gzip", str(err)) from None
        return self._stream

    def _check_end(self) -> None:
        """The last record must end exactly at the end of the file (O(1) count check)."""
        if not len(self.offsets):
            if self.size:
                raise TFRecordShardError(f"{self._name}: {self.size} bytes but no records")
            return
        last = int(self.offsets[-1])
        head = self._pread(last, HEADER_BYTES)
        length = int.from_bytes(head[:8], "little") if len(head) == HEADER_BYTES else -1
        if length < 0 or last + HEADER_BYTES + length + FOOTER_BYTES != self.size:
            raise TFRecordShardError(
                f"{self._name}: the last of {len(self.offsets)} records does not end the "
                f"{self.size}-byte file; records were added, removed or cut"
            )

    def _file_size(self) -> int:
        if self._path is not None:
            return os.path.getsize(self._path)
        return int(self._handle.size())

    def _pread(self, offset: int, n: int) -> bytes:
        if self._path is not None:
            fd = os.open(self._path, os.O_RDONLY)
            try:
                return os.pread(fd, n, offset)
            finally:
                os.close(fd)
        return self._handle.read_at(n, offset).to_pybytes()

    def _reopen(self) -> Any:
        import io

        return io.BytesIO(self._pread(0, self.size))


def _row_values(table: pa.Table, features: list[Feature]) -> list[list]:
    """Per feature, one value per row: a flat array, a str/bytes, or None for a null."""
    out = []
    for feature in features:
        column = table.column(feature.name).combine_chunks()
        if feature.dtype == "image":
            column = column.field("bytes")
        if feature.is_numeric:
            out.append(_numeric_rows(column, feature))
        else:  # one bytes_list value per row
            values = column.to_pylist()
            if feature.dtype == "image" and table.column(feature.name).null_count:
                valid = np.asarray(table.column(feature.name).combine_chunks().is_valid())
                values = [v if ok else None for v, ok in zip(values, valid, strict=True)]
            out.append([None if v is None else [v] for v in values])
    return out


def _numeric_rows(column: pa.Array, feature: Feature) -> list:
    n = len(column)
    values = column
    for _ in range(len(feature.shape) if feature.is_tensor else 0):
        values = values.flatten()
    flat = values.to_numpy(zero_copy_only=False)
    if feature.dtype == "uint64":
        flat = flat.view(np.int64)
    elif feature.dtype == "bool":
        flat = flat.astype(np.int64)
    rows = flat.reshape(n, -1) if n else flat.reshape(0, 1)
    if column.null_count or values.null_count:
        valid = np.asarray(column.is_valid())
        return [rows[i] if valid[i] else None for i in range(n)]
    return list(rows)


def _column(examples: list[dict], feature: Feature) -> pa.Array:
    """One feature's Arrow column from decoded Examples."""
    name = feature.name
    kind = example_kind(feature)
    got = [e.get(name) for e in examples]
    for value in got:
        if value is not None and value[0] not in (kind, None):
            raise TFRecordShardError(f"feature {name!r} is stored as {value[0]}, expected {kind}")
    if feature.is_numeric:
        width = feature.num_elements if feature.is_tensor else 1
        valid = np.array([v is not None and v[1] is not None for v in got], dtype=bool)
        flat = np.zeros((len(got), width), dtype=np.float64 if kind == "float" else np.int64)
        for i in np.flatnonzero(valid):
            values = got[i][1]
            if len(values) != width:
                raise TFRecordShardError(f"feature {name!r} has {len(values)} values, not {width}")
            flat[i] = values
        typed = flat.view(np.uint64) if feature.dtype == "uint64" else flat.astype(feature.dtype)
        if feature.is_tensor:
            array = nest(pa.array(typed.reshape(-1)), feature.shape)
        else:
            array = pa.array(typed.reshape(-1))
        if not valid.all():
            array = pa.array(
                [array[i].as_py() if valid[i] else None for i in range(len(got))], array.type
            )
        return array.cast(feature.arrow_type)
    items = [v[1][0] if v is not None and v[1] else None for v in got]
    if feature.dtype == "image":
        return pa.array(
            [None if b is None else {"bytes": b, "path": None} for b in items],
            feature.arrow_type,
        )
    return pa.array([None if b is None else b.decode("utf-8") for b in items], pa.string())
