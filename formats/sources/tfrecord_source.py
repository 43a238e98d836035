"""TFRecord files of ``tf.train.Example`` (TFX ExampleGen, TFDS outputs) as a source, without
TensorFlow: our own framing reader (``formats/tfrecord.py``) and Example decoder.

One unit per record. ``root`` is a file or a directory: every file below it whose name holds
``tfrecord`` (``*.tfrecord``, ``*.tfrecords``, ``data_tfrecord-00000-of-00012.gz``), sorted; GZIP
is sniffed per file.

**Schema.** ``infer`` is a cheap first pass over **all** records of a file: per feature, the
count of each Example kind, of empty values, of value-list lengths, and for bytes whether every
value is UTF-8 text or an image. ``merge_inferred`` sums files, so a feature present in one record
of one file is still typed (the real Chicago taxi corpus has such a feature). A feature's kind is
its most common kind (ties: int64, float, bytes); its type then follows:

| kind | lengths seen | feature |
|---|---|---|
| ``int64`` / ``float`` | always 1 | ``int64`` / ``float32`` scalar |
| ``int64`` / ``float`` | always ``n > 1`` | ``[n]`` tensor |
| ``int64`` / ``float`` | varying | string of canonical JSON (``"encoding": "json"``) |
| ``bytes`` | always 1, every value an image | ``image`` |
| ``bytes`` | always 1, every value UTF-8 | ``string`` |
| ``bytes`` | always 1, otherwise | string of base64 (``"encoding": "base64"``) |
| ``bytes`` | varying | string of canonical JSON (a list of text) |

A record missing a feature, or holding an empty list, gets null. **Rejects**: a bad data CRC
(``tfrecord_data_crc``, reading goes on), a bad length CRC or a truncated file (the rest of that
file is unreadable: one reject), a record that is not an Example (``example_invalid``), and a
feature whose kind conflicts with the merged schema (``field_type``).
"""

from __future__ import annotations

import base64
import itertools
import math
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, BinaryIO, ClassVar

import numpy as np
import pyarrow as pa

from shardfeed.formats.columns import conform
from shardfeed.formats.sources import json_text
from shardfeed.formats.sources.base import (
    DatasetMeta,
    RowsScan,
    ScanResult,
    UnitRef,
    content_digest,
)
from shardfeed.formats.sources.drift import (
    describe,
    drifts,
    example_files,
    file_majority,
    merge_counts,
    merge_example_files,
)
from shardfeed.formats.sources.listing import list_files, source_root
from shardfeed.formats.sources.tfrecord_columns import KindTally, is_utf8, tally_batch, type_batch
from shardfeed.formats.tf_example import ExampleDecodeError, decode_example
from shardfeed.formats.tf_example_batch import decode_batch
from shardfeed.formats.tfrecord import (
    HEADER_BYTES,
    TFRecordError,
    iter_records,
    read_record_at,
    record_boundaries,
    sniff_compression,
)
from shardfeed.schemas.errors import ShardfeedError, UnsafePathError
from shardfeed.schemas.features import Feature, FeatureSpec
from shardfeed.schemas.rejects import RejectError, RejectRecord

KIND_ORDER = ("int64", "float", "bytes")  # tie-break: the first wins
_BATCH_RECORDS = 8192  # records per decoded batch and spooled part
_BATCH_BYTES = 32 << 20  # ... or about this many record bytes
#: records (or record bytes) at the head of a piece that the fused scan's first guess of the
#: features comes from (``sample_piece``)
SAMPLE_RECORDS = 1024
SAMPLE_BYTES = 1 << 20
MAX_RECORD_BYTES = 256 << 20  # a larger record is a reject, never held in memory
_IMAGE_MAGIC = (b"\xff\xd8\xff", b"\x89PNG\r\n\x1a\n", b"GIF8", b"RIFF", b"BM")


@dataclass(frozen=True)
class InferredExamples:
    """Per-feature counts over some records (JSON-able, so it travels between stages):
    ``kinds[name][kind]``, ``lengths[name][str(n)]`` (non-empty values), ``text[name]`` /
    ``images[name]`` (bytes values that are UTF-8 / images), ``values[name]`` (non-empty)."""

    records: int = 0
    kinds: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    lengths: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    text: Mapping[str, int] = field(default_factory=dict)
    images: Mapping[str, int] = field(default_factory=dict)
    #: ``files[name][kind]``: the first few files (sorted) holding that kind, for messages
    files: Mapping[str, Mapping[str, list[str]]] = field(default_factory=dict)
    #: ``majors[name][kind]``: how many files (or pieces) hold mostly that kind
    majors: Mapping[str, Mapping[str, int]] = field(default_factory=dict)


def merge_inferred(a: InferredExamples, b: InferredExamples) -> InferredExamples:
    """Sum two fragments; associative and commutative, ``InferredExamples()`` the identity."""

    def add_flat(x: Mapping[str, int], y: Mapping[str, int]) -> dict:
        out = dict(x)
        for k, n in y.items():
            out[k] = out.get(k, 0) + n
        return out

    return InferredExamples(
        a.records + b.records,
        merge_counts(a.kinds, b.kinds),
        merge_counts(a.lengths, b.lengths),
        add_flat(a.text, b.text),
        add_flat(a.images, b.images),
        merge_example_files(a.files, b.files),
        merge_counts(a.majors, b.majors),
    )


def resolve_kind(counts: Mapping[str, int]) -> str:
    return max(KIND_ORDER, key=lambda k: (counts.get(k, 0), -KIND_ORDER.index(k)))


def check_drift(name: str, inferred: InferredExamples, unify: bool) -> str | None:
    """The kind a feature held in many records besides its own, when files disagree on it:
    ``float`` joins ``int64`` under ``unify`` (the feature becomes float64, exact for every
    float32 and every integer up to 2**53). Otherwise a ShardfeedError naming the feature, example
    files of each kind and the flag. None when one kind dominates (others are stray records)."""
    counts = {k: n for k, n in inferred.kinds.get(name, {}).items() if n}
    majors = inferred.majors.get(name, {})
    if len(counts) < 2 or not drifts(counts, resolve_kind(counts), majors):
        return None
    if unify and set(counts) == {"int64", "float"}:
        return "float64"
    remedy = (
        "pass --unify-schemas to convert int64 and float values as float64"
        if set(counts) == {"int64", "float"} and not unify
        else "no lossless promotion joins these kinds; convert the files separately"
    )
    votes = {k: counts[k] for k in sorted(counts, key=KIND_ORDER.index)}
    raise ShardfeedError(describe(name, votes, inferred.files.get(name, {}), remedy))


def feature_for(name: str, inferred: InferredExamples, unify: bool = False) -> Feature:
    """The feature a merged inference gives ``name`` (the table in the module docstring)."""
    if check_drift(name, inferred, unify) == "float64":
        lengths = {int(n) for n, c in inferred.lengths.get(name, {}).items() if c}
        if lengths == {1}:
            return Feature(name, "float64", (1,), extra={"unified": "int64+float"})
        fixed = lengths.pop() if len(lengths) == 1 else None
        if fixed is not None:
            return Feature(name, "float64", (fixed,), extra={"unified": "int64+float"})
        return Feature(name, "string", (1,), extra={"encoding": "json", "example_kind": "number"})
    kind = resolve_kind(inferred.kinds.get(name, {}))
    lengths = {int(n) for n, c in inferred.lengths.get(name, {}).items() if c}
    values = sum(inferred.lengths.get(name, {}).values())
    fixed = lengths.pop() if len(lengths) == 1 else None
    if kind in ("int64", "float"):
        dtype = "int64" if kind == "int64" else "float32"
        if fixed == 1 or not values:
            return Feature(name, dtype, (1,))
        if fixed is not None:
            return Feature(name, dtype, (fixed,))
        return Feature(name, "string", (1,), extra={"encoding": "json", "example_kind": kind})
    if fixed not in (1, None) or (fixed is None and values):
        return Feature(name, "string", (1,), extra={"encoding": "json", "example_kind": kind})
    if values and inferred.images.get(name, 0) == values:
        return Feature(name, "image", ())
    if inferred.text.get(name, 0) == values:
        return Feature(name, "string", (1,))
    return Feature(name, "string", (1,), extra={"encoding": "base64"})


class TFRecordSource:
    """TFRecord ``tf.train.Example`` reader implementing the ``SourceReader`` protocol."""

    kind: ClassVar[str] = "tfrecord"
    first_position: ClassVar[int] = 0  # a unit's position is its record number
    merge_inferred = staticmethod(merge_inferred)
    inferred_type = InferredExamples

    def __init__(
        self, root: str, *, max_record_bytes: int = MAX_RECORD_BYTES, unify_schemas: bool = False
    ) -> None:
        self.max_record_bytes = max_record_bytes
        self.unify_schemas = unify_schemas
        self._location, self._single = source_root(os.fspath(root), "TFRecord source")
        self.root = self._location.root

    def __repr__(self) -> str:
        return f"TFRecordSource({self.root!r})"

    def files(self) -> list[str]:
        if self._single is not None:
            return [self._single]
        return list_files(self._location, lambda path: is_tfrecord_name(path.rsplit("/", 1)[-1]))

    def meta(self) -> DatasetMeta:
        return DatasetMeta()

    def reject_location(self, ref: UnitRef) -> tuple[str, str]:
        return ref.file, f"record:{ref.position}"

    # -- schema --------------------------------------------------------------------------------
    def infer(self, file: str) -> InferredExamples:
        """Kind, length and text/image counts of every good record of ``file``: a batch's
        regular records counted as columns, the others one by one."""
        return self.infer_piece(file, 0, -1)[0]

    def infer_piece(self, file: str, start: int, stop: int) -> tuple[InferredExamples, int]:
        """``infer`` over the records in bytes ``[start, stop)`` (a piece from :meth:`pieces`),
        and how many records the piece holds."""
        tally = KindTally()
        span = 0
        for batch in self._batches(file, None, start, stop):
            span += len(batch.records)
            _tally_batch(batch, decode_batch(batch.records), tally)
        return _inferred(file, tally), span

    def sample_piece(self, file: str, start: int, stop: int) -> tuple[InferredExamples, int]:
        """A first guess at the piece's share of ``infer``, from its first
        :data:`SAMPLE_RECORDS` records (:meth:`scan_inferring` then counts them all), and,
        exactly as ``infer_piece`` does, how many records it holds (0 for a whole file, by a
        pass over the framing alone)."""
        whole = (start, stop) == (0, -1)
        tally, span = KindTally(), 0
        for batch in self._batches(file, None, start, stop, 0, SAMPLE_RECORDS, SAMPLE_BYTES):
            if not span:  # the first batch is the sample
                _tally_batch(batch, decode_batch(batch.records), tally)
            span += len(batch.records)
            if whole:  # a whole file's span is not needed
                break
        return _inferred(file, tally), 0 if whole else span

    def scan_inferring(
        self, file: str, spec: FeatureSpec | None, start: int, stop: int, first: int
    ) -> _InferringScan:
        """``scan_piece`` that also counts the piece's share of ``infer`` from the same decoded
        batches (``spec`` None: only counts)."""
        return _InferringScan(self, file, spec, (start, stop, first))

    def pieces(self, file: str, piece_bytes: int) -> list[tuple[int, int]]:
        """Byte ranges of whole records, about ``piece_bytes`` each, from a pass over the record
        headers only; one piece ``(0, -1)`` for a file that fits, or a gzip file (which cannot be
        entered in the middle)."""
        if not self._location.is_local:  # the header walk would be a ranged read per record
            return [(0, -1)]
        try:
            path = self._path(file)
            with open(path, "rb") as handle:
                size = os.fstat(handle.fileno()).st_size
                if size <= piece_bytes or sniff_compression(handle.read(HEADER_BYTES)) == "gzip":
                    return [(0, -1)]
                cuts = record_boundaries(handle, size, piece_bytes)
        except (OSError, UnsafePathError):
            return [(0, -1)]  # the scan reports it
        edges = [0, *cuts, -1]
        return list(itertools.pairwise(edges))

    def spec(self, inferred: Any | None = None) -> FeatureSpec:
        if not isinstance(inferred, InferredExamples):
            raise ShardfeedError(
                f"TFRecord source {self.root}: the features are typed from the data; pass the "
                "merged InferredExamples of infer() over all files"
            )
        if not inferred.kinds:
            raise ShardfeedError(
                f"TFRecord source {self.root}: no feature has a value in {inferred.records} records"
            )
        unify = self.unify_schemas
        return FeatureSpec(tuple(feature_for(n, inferred, unify) for n in sorted(inferred.kinds)))

    # -- scan and read -------------------------------------------------------------------------
    def scan(self, file: str, spec: FeatureSpec) -> ScanResult:
        result = ScanResult()
        convert = _Converter(spec)
        for position, (offset, data, example) in enumerate(self._examples(file, result.rejects)):
            where = f"record:{position}"
            if example is None:
                continue
            try:
                _, payload = convert(example)
            except RejectError as err:
                result.rejects.append(RejectRecord.from_error(file, where, err))
                continue
            result.units.append(
                UnitRef(
                    file=file,
                    position=position,
                    rows=1,
                    payload_bytes=payload,
                    content_hash=content_digest(data),
                    locator=(offset, len(data)),
                )
            )
        return result

    def scan_rows(self, file: str, spec: FeatureSpec) -> Iterator[RowsScan]:
        """The good records of ``file`` converted to ``spec``, a batch at a time, with the
        rejects (:class:`~shardfeed.formats.sources.base.SpoolingSource`): a gzip file is
        inflated and every record decoded once, however many shards its records go to.

        A batch's regular records are decoded and typed as columns
        (``formats/tf_example_batch.py``, ``tfrecord_columns.py``); the others go through the
        record decoder and ``_Converter``, and the two are merged in record order."""
        return self.scan_piece(file, spec, 0, -1, 0)

    def scan_piece(
        self, file: str, spec: FeatureSpec, start: int, stop: int, first: int
    ) -> Iterator[RowsScan]:
        """``scan_rows`` over bytes ``[start, stop)``, whose first record is record ``first``."""
        return self._scan(file, spec, (start, stop, first), None)

    def _scan(
        self,
        file: str,
        spec: FeatureSpec | None,
        piece: tuple[int, int, int],
        tally: KindTally | None,
    ) -> Iterator[RowsScan]:
        """The piece's records typed to ``spec`` (nothing when None), a batch at a time; with
        ``tally``, every batch's kinds are counted from the same decoding, as ``infer`` does."""
        start, stop, first = piece
        convert = None if spec is None else _Converter(spec)
        rejects: list[RejectRecord] = []
        errors = None if spec is None else rejects
        for batch in self._batches(file, errors, start, stop, first):
            decoded = decode_batch(batch.records)
            if tally is not None:
                tally_batch(decoded, tally, _IMAGE_MAGIC)
            odd = np.flatnonzero(decoded.irregular)
            examples = {}
            for i in odd.tolist():  # the record decoder's, for what the batch decoder left over
                example = _decoded(batch.records[i], file, batch.offsets[i], errors)
                if example is not None:
                    examples[i] = example
                    if tally is not None:
                        tally.records += 1
                        _tally_example(example, tally)
            if spec is None or convert is None:
                continue
            typed = type_batch(decoded, spec)
            positions = batch.first + typed.kept
            for i, err in typed.rejects:
                rejects.append(RejectRecord.from_error(file, f"record:{batch.first + i}", err))
            table, payload = typed.table, typed.payload
            rows, extra, sizes = [], [], []
            for i, example in examples.items():
                try:
                    values, size = convert(example)
                except RejectError as err:
                    where = f"record:{batch.first + i}"
                    rejects.append(RejectRecord.from_error(file, where, err))
                    continue
                rows.append(values)
                extra.append(batch.first + i)
                sizes.append(size)
            if rows:
                positions = np.concatenate([positions, np.asarray(extra, np.int64)])
                payload = np.concatenate([payload, np.asarray(sizes, np.int64)])
                table = pa.concat_tables([table, _rows_table(rows, spec)])
                order = np.argsort(positions, kind="stable")
                positions, payload = positions[order], payload[order]
                table = table.take(pa.array(order))
            hashes = [content_digest(batch.records[i]) for i in (positions - batch.first).tolist()]
            if len(positions) or rejects:
                yield RowsScan.one_row_each(positions, payload, hashes, table, rejects)
                rejects = []
        if rejects and spec is not None:
            yield RowsScan.one_row_each([], [], [], spec.arrow_schema().empty_table(), rejects)

    def read(self, refs: Sequence[UnitRef], spec: FeatureSpec) -> pa.Table:
        convert = _Converter(spec)
        rows: list[list[Any] | None] = [None] * len(refs)
        by_file: dict[str, dict[int, list[int]]] = {}
        for i, ref in enumerate(refs):
            by_file.setdefault(ref.file, {}).setdefault(int(ref.locator[0]), []).append(i)
        for file in sorted(by_file):
            wanted = by_file[file]
            for offset, data in self._fetch(file, sorted(wanted)):
                for i in wanted[offset]:
                    if refs[i].content_hash != content_digest(data):
                        raise ShardfeedError(f"{file} record {refs[i].position} changed since scan")
                values, _ = convert(decode_example(data))
                for i in wanted[offset]:
                    rows[i] = values
        if any(r is None for r in rows):
            missing = refs[rows.index(None)]
            raise ShardfeedError(f"{missing.file} record {missing.position} is gone since scan")
        return _rows_table(rows, spec)

    # -- internals -----------------------------------------------------------------------------
    def _path(self, file: str) -> str:
        return self._location.path(file, "file")

    def _examples(
        self, file: str, errors: list[RejectRecord] | None
    ) -> Iterator[tuple[int, bytes, dict | None]]:
        """``(offset, data, example or None)`` per record; bad records become rejects."""
        for batch in self._batches(file, errors):
            for offset, data in zip(batch.offsets, batch.records, strict=True):
                yield offset, data, _decoded(data, file, offset, errors)

    def _batches(
        self,
        file: str,
        errors: list[RejectRecord] | None,
        start: int = 0,
        stop: int = -1,
        first: int = 0,
        batch_records: int = _BATCH_RECORDS,
        batch_bytes: int = _BATCH_BYTES,
    ) -> Iterator[_Batch]:
        """The framed records of ``file`` (of bytes ``[start, stop)``, whose first record is
        record ``first``) in batches of at most ``_BATCH_RECORDS`` records or about
        ``_BATCH_BYTES``; framing faults, an unsafe link or an unreadable file become rejects
        (when ``errors`` is given)."""

        def report(err: TFRecordError) -> None:
            if errors is not None:
                errors.append(
                    RejectRecord.from_error(
                        file, f"offset:{err.offset}", RejectError(err.reject_reason, str(err))
                    )
                )

        batch, size = _Batch(first), 0
        try:
            with self._location.open_input(file, "file") as handle:
                records: Iterator[tuple[int, bytes]] = iter_records(
                    _Window(handle, start, stop) if (start, stop) != (0, -1) else handle,
                    compression="auto" if (start, stop) == (0, -1) else None,
                    on_error=report,
                    max_record_bytes=self.max_record_bytes,
                    name=file,
                    base_offset=start,
                )
                for offset, data in records:
                    batch.offsets.append(offset)
                    batch.records.append(data)
                    size += len(data)
                    if len(batch.records) >= batch_records or size >= batch_bytes:
                        yield batch
                        batch, size = _Batch(batch.first + len(batch.records)), 0
        except UnsafePathError as err:  # a link leading outside the root
            if errors is not None:
                errors.append(
                    RejectRecord.from_error(file, "", RejectError("path_escape", err.message))
                )
        except OSError as err:
            if errors is not None:
                errors.append(
                    RejectRecord.from_error(
                        file, "", RejectError("io_error", f"cannot read: {err}")
                    )
                )
        if batch.records:
            yield batch

    def _fetch(self, file: str, offsets: list[int]) -> Iterator[tuple[int, bytes]]:
        with self._location.open_input(file, "file") as handle:
            if handle.read(2) != b"\x1f\x8b":
                for offset in offsets:
                    yield offset, read_record_at(handle, offset, name=file)
                return
            handle.seek(0)
            wanted = set(offsets)
            records = iter_records(handle, max_record_bytes=self.max_record_bytes, name=file)
            for offset, data in records:
                if offset in wanted:
                    yield offset, data
                    if offset >= offsets[-1]:
                        return


def _rows_table(rows: Sequence[Sequence[Any]], spec: FeatureSpec) -> pa.Table:
    """Converted rows (one value per stored feature) as a table in ``spec``'s schema."""
    columns = list(zip(*rows, strict=True)) if rows else [[] for _ in spec.stored]
    arrays = {
        f.name: pa.array(list(col), f.arrow_type)
        for f, col in zip(spec.stored, columns, strict=True)
    }
    return conform(pa.table(arrays), spec)


class _Window:
    """Bytes ``[start, stop)`` of an open file (``stop`` -1: to the end), read as a stream."""

    def __init__(self, handle: BinaryIO, start: int, stop: int) -> None:
        handle.seek(start)
        self._handle = handle
        self._left = None if stop < 0 else stop - start

    def read(self, n: int) -> bytes:
        if self._left is None:
            return self._handle.read(n)
        data = self._handle.read(min(n, self._left))
        self._left -= len(data)
        return data


@dataclass
class _Batch:
    """Framed records of one file: ``first`` is the position (record number) of the first."""

    first: int
    offsets: list[int] = field(default_factory=list)
    records: list[bytes] = field(default_factory=list)


class _InferringScan:
    """One piece scanned and inferred in a single pass: iterating yields its rows typed to
    ``spec`` (nothing when None) while every batch's kinds are counted from the decoding that
    typed it; :meth:`inferred` is then the piece's share of ``infer``."""

    def __init__(
        self,
        source: TFRecordSource,
        file: str,
        spec: FeatureSpec | None,
        piece: tuple[int, int, int],
    ) -> None:
        self._source, self._file, self._spec, self._piece = source, file, spec, piece
        self._tally = KindTally()

    def __iter__(self) -> Iterator[RowsScan]:
        yield from self._source._scan(self._file, self._spec, self._piece, self._tally)

    def inferred(self) -> InferredExamples:
        return _inferred(self._file, self._tally)


def _tally_batch(batch: _Batch, decoded: Any, tally: KindTally) -> None:
    """Count a batch's kinds: its regular records as columns, the others one by one."""
    tally_batch(decoded, tally, _IMAGE_MAGIC)
    for i in np.flatnonzero(decoded.irregular).tolist():
        example = _decoded(batch.records[i])
        if example is not None:
            tally.records += 1
            _tally_example(example, tally)


def _inferred(file: str, tally: KindTally) -> InferredExamples:
    kinds = tally.kinds
    return InferredExamples(
        tally.records,
        kinds,
        tally.lengths,
        tally.text,
        tally.images,
        example_files(file, kinds),
        file_majority(kinds, resolve_kind),
    )


def _decoded(
    data: bytes,
    file: str = "",
    offset: int = 0,
    errors: list[RejectRecord] | None = None,
) -> dict | None:
    """The record's Example, or None (an ``example_invalid`` reject, when ``errors`` is given)."""
    try:
        return decode_example(data)
    except ExampleDecodeError as err:
        if errors is not None:
            where = f"offset:{offset}"
            errors.append(
                RejectRecord.from_error(file, where, RejectError("example_invalid", str(err)))
            )
        return None


def _tally_example(example: Mapping[str, tuple], tally: KindTally) -> None:
    """Count one decoded Example's features (a record the batch decoder left to the record
    decoder)."""
    for name, (kind, values) in example.items():
        if kind is None or values is None or len(values) == 0:
            continue
        counts = tally.kinds.setdefault(name, {})
        counts[kind] = counts.get(kind, 0) + 1
        seen = tally.lengths.setdefault(name, {})
        seen[str(len(values))] = seen.get(str(len(values)), 0) + 1
        if kind == "bytes":
            tally.text[name] = tally.text.get(name, 0) + all(is_utf8(v) for v in values)
            tally.images[name] = tally.images.get(name, 0) + all(
                v.startswith(_IMAGE_MAGIC) for v in values
            )


def is_tfrecord_name(name: str) -> bool:
    return "tfrecord" in name.lower() and not name.startswith(".")


class _Converter:
    """An Example -> the spec's row values and payload bytes; a kind conflict is a reject."""

    def __init__(self, spec: FeatureSpec) -> None:
        self.features = list(spec.stored)

    def __call__(self, example: Mapping[str, tuple]) -> tuple[list[Any], int]:
        out, payload = [], 0
        for f in self.features:
            kind, values = example.get(f.name, (None, None))
            if kind is None or values is None or len(values) == 0:
                out.append(None)
                continue
            value, size = _value(f, kind, values)
            out.append(value)
            payload += size
        return out, payload


def _value(f: Feature, kind: str, values: Any) -> tuple[Any, int]:
    encoding = f.extra.get("encoding")
    if f.is_numeric:
        want = "float" if f.dtype.startswith("float") else "int64"
        if kind == "int64" and f.extra.get("unified"):  # --unify-schemas: exact integers only
            ints = np.asarray(values, dtype=np.int64)
            if ints.size and (int(ints.max()) > 2**53 or int(ints.min()) < -(2**53)):
                raise RejectError(
                    "field_type",
                    f"feature {f.name!r} holds an integer beyond 2**53, which float64 cannot "
                    "hold exactly",
                )
            kind = want
        if kind != want:
            raise RejectError(
                "field_type", f"feature {f.name!r} holds {kind}, the schema has {want}"
            )
        if len(values) != f.num_elements:
            raise RejectError(
                "field_type",
                f"feature {f.name!r} holds {len(values)} values, the schema has {f.num_elements}",
            )
        array = np.asarray(values).astype(f.dtype)
        return (array if f.is_tensor else array[0].item()), array.nbytes
    if encoding == "json":
        if kind != f.extra.get("example_kind", kind) and f.extra.get("example_kind") != "number":
            raise RejectError(
                "field_type",
                f"feature {f.name!r} holds {kind}, the schema has {f.extra['example_kind']}",
            )
        if kind == "bytes":
            if f.extra.get("example_kind") == "number":
                raise RejectError("field_type", f"feature {f.name!r} holds bytes, not numbers")
            items = [v.decode("utf-8", "backslashreplace") for v in values]
        else:
            items = [_json_number(v) for v in np.asarray(values).tolist()]
        text = json_text.CANONICAL.encode(items)
        return text, len(text.encode())
    if kind != "bytes":
        raise RejectError("field_type", f"feature {f.name!r} holds {kind}, the schema has bytes")
    if len(values) != 1:
        raise RejectError("field_type", f"feature {f.name!r} holds {len(values)} values, not 1")
    data = values[0]
    if f.dtype == "image":
        return {"bytes": data, "path": None}, len(data)
    if encoding == "base64":
        return base64.b64encode(data).decode("ascii"), len(data)
    try:
        return data.decode("utf-8"), len(data)
    except UnicodeDecodeError:
        raise RejectError("utf8_invalid", f"feature {f.name!r} is not UTF-8 text") from None


def _json_number(v: float | int) -> float | int | None:
    return None if isinstance(v, float) and not math.isfinite(v) else v
