"""JSON Lines text source: ``*.jsonl``, ``*.jsonl.gz`` and ``*.jsonl.zst`` files, one JSON object a line.

Passes (see :mod:`shardfeed.formats.sources.base`):

1. ``infer(file)`` counts, per top-level key, how many values of each kind it holds; the fragments merge
   with :func:`merge_inferred` (associative and commutative, so Beam may combine them in any order);
2. ``spec(merged)`` turns the counts into columns: the text field first, then the other keys by name;
3. ``scan(file, spec)`` validates every line and returns one :class:`UnitRef` per good record, with
   ``locator = (byte_offset, byte_length)`` of the line in the *decompressed* stream;
4. ``read(refs, spec)`` re-reads those lines (random access for plain files; one streaming pass per
   compressed file) and converts them exactly as ``scan`` validated them.

Kinds: ``bool``, ``int``, ``float``, ``string`` and ``json`` (a nested object or array, stored as a
canonical JSON string and marked ``"encoding": "json"`` in the feature). ``null`` never votes.
A key's kind is its majority kind, where ``int`` and ``float`` vote together as numbers (``float`` if
any value is a float); ties go to the first of :data:`KIND_ORDER`. Values that disagree with the
column's kind are ``field_type`` rejects.

Compression is detected from magic bytes (gzip ``1f 8b``, zstd ``28 b5 2f fd``), not the file name.
Decompressed streams are bounded by ``max_expanded_bytes``: lines that end within the bound are kept,
the rest of the file is one ``decompression_bomb`` reject at the first dropped line. Lines longer
than ``max_line_bytes`` are ``json_invalid`` rejects and are never held in memory.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa
import zstandard

from shardfeed.formats.columns import conform
from shardfeed.formats.sources import json_text
from shardfeed.formats.sources.base import DatasetMeta, ScanResult, UnitRef, content_digest
from shardfeed.formats.sources.listing import list_files, source_root
from shardfeed.schemas.errors import ShardfeedError, UnsafePathError
from shardfeed.schemas.features import Feature, FeatureSpec
from shardfeed.schemas.rejects import RejectError, RejectRecord

__all__ = [
    "JSON_EXTRA",
    "KINDS",
    "KIND_DTYPES",
    "KIND_ORDER",
    "SUFFIXES",
    "InferredSchema",
    "JsonlSource",
    "merge_inferred",
    "resolve_kind",
]

#: Value kinds a top-level key can hold; ``null`` values are counted but never vote.
KINDS = ("bool", "int", "float", "string", "json")
#: Tie-break order when two kinds have equal counts (first wins).
KIND_ORDER = ("string", "float", "int", "bool", "json")
#: Feature dtype of each kind (all shape ``[1]``).
KIND_DTYPES = {
    "bool": "bool",
    "int": "int64",
    "float": "float64",
    "string": "string",
    "json": "string",
}
#: Marker in ``Feature.extra`` for string columns that hold canonical JSON text.
JSON_EXTRA = {"encoding": "json"}

SUFFIXES = (".jsonl", ".jsonl.gz", ".jsonl.zst")
_GZIP_MAGIC = b"\x1f\x8b"
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_BOM = b"\xef\xbb\xbf"
_CHUNK = 1 << 20  # 1 MiB decompressed per read
_COALESCE_GAP = 1 << 20  # plain files: merge line reads less than 1 MiB apart ...
_COALESCE_SPAN = 16 << 20  # ... into reads of at most 16 MiB (unless one line is longer)


# --------------------------------------------------------------------------------------------------
# Schema inference


@dataclass(frozen=True)
class InferredSchema:
    """Per-key value counts of some records: ``fields[key][kind]``, kinds from :data:`KINDS` plus
    ``"null"``. ``records`` counts the valid JSON objects seen. Picklable; merge with
    :func:`merge_inferred`; ``InferredSchema()`` is the identity."""

    records: int = 0
    fields: Mapping[str, Mapping[str, int]] = field(default_factory=dict)

    def kinds(self) -> dict[str, str]:
        """The resolved kind of every key (keys holding only nulls become ``string``)."""
        return {name: resolve_kind(counts) for name, counts in self.fields.items()}


def merge_inferred(a: InferredSchema, b: InferredSchema) -> InferredSchema:
    """Sum two fragments' counts; associative and commutative, with ``InferredSchema()`` as identity."""
    fields = {name: dict(counts) for name, counts in a.fields.items()}
    for name, counts in b.fields.items():
        into = fields.setdefault(name, {})
        for kind, n in counts.items():
            into[kind] = into.get(kind, 0) + n
    return InferredSchema(a.records + b.records, fields)


def resolve_kind(counts: Mapping[str, int]) -> str:
    """Majority kind of one key: ints and floats vote together (as ``float`` if any float), nulls
    abstain, ties go to the first of :data:`KIND_ORDER`; a key with no votes is ``string``."""
    votes = {k: n for k, n in counts.items() if k in KINDS and n > 0}
    numbers = votes.pop("int", 0) + votes.pop("float", 0)
    if numbers:
        votes["float" if counts.get("float", 0) > 0 else "int"] = numbers
    if not votes:
        return "string"
    return max(votes, key=lambda k: (votes[k], -KIND_ORDER.index(k)))


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "string"
    return "json"


# --------------------------------------------------------------------------------------------------
# Bytes -> lines -> records


@dataclass(frozen=True)
class _Line:
    """One line of the decompressed stream, without its newline; dropped lines carry an ``error``."""

    number: int  # 1-based
    offset: int  # byte offset in the decompressed stream
    data: bytes  # empty when the line was dropped
    error: RejectError | None = None


def _sniff(head: bytes) -> str:
    if head.startswith(_GZIP_MAGIC):
        return "gzip"
    if head.startswith(_ZSTD_MAGIC):
        return "zstd"
    return "none"


class _ZstdFrames:
    """Follows zstd frame and block headers through the compressed bytes, to tell a complete stream
    from a truncated one (zstandard's stream reader ends silently at a truncation)."""

    def __init__(self) -> None:
        self.state = "magic"
        self.pending = bytearray()
        self.skip = 0
        self.checksum = False

    @property
    def complete(self) -> bool:
        return self.state == "magic" and not self.pending and not self.skip

    def feed(self, data: bytes) -> None:
        i, n = 0, len(data)
        while i < n and self.state != "invalid":
            if self.skip:
                take = min(self.skip, n - i)
                self.skip -= take
                i += take
                continue
            need = {"magic": 4, "size": 4, "descriptor": 1, "block": 3}[self.state]
            take = min(need - len(self.pending), n - i)
            self.pending += data[i : i + take]
            i += take
            if len(self.pending) == need:
                self._header(bytes(self.pending))
                self.pending.clear()

    def _header(self, head: bytes) -> None:
        value = int.from_bytes(head, "little")
        if self.state == "magic":
            if head == _ZSTD_MAGIC:
                self.state = "descriptor"
            elif head[0] & 0xF0 == 0x50 and head[1:] == b"\x2a\x4d\x18":  # skippable frame
                self.state = "size"
            else:
                self.state = "invalid"  # the decompressor reports it
        elif self.state == "size":
            self.skip, self.state = value, "magic"
        elif self.state == "descriptor":
            fcs, single, dict_id = value >> 6, (value >> 5) & 1, value & 3
            self.checksum = bool((value >> 2) & 1)
            self.skip = (0 if single else 1) + (0, 1, 2, 4)[dict_id] + (single, 2, 4, 8)[fcs]
            self.state = "block"
        else:  # block header: last flag, type (raw, RLE, compressed), size
            kind, size = (value >> 1) & 3, value >> 3
            self.skip = 1 if kind == 1 else size
            if value & 1:
                self.skip += 4 if self.checksum else 0
                self.state = "magic"


class _ZstdReader:
    """zstandard's streaming reader, across frames, that raises ZstdError on a truncated stream."""

    def __init__(self, handle: Any) -> None:
        self._frames = _ZstdFrames()
        self._reader = zstandard.ZstdDecompressor().stream_reader(
            _Observed(handle, self._frames.feed), read_across_frames=True, closefd=False
        )

    def read(self, size: int) -> bytes:
        data = self._reader.read(size)
        if not data and not self._frames.complete:
            raise zstandard.ZstdError("it ends inside a frame")
        return data

    def close(self) -> None:
        self._reader.close()


@dataclass
class _Observed:
    """A readable that shows every byte it returns to ``observe``."""

    handle: Any
    observe: Callable[[bytes], None]

    def read(self, size: int = -1) -> bytes:
        data = self.handle.read(size)
        self.observe(data)
        return data


def _iter_lines(
    stream: Any, compression: str, max_line: int, max_expanded: int | None
) -> Iterator[_Line]:
    """Split a (decompressed) byte stream into lines without ever holding more than ``max_line``
    bytes of one line. Ends with a dropped line if the stream breaks or passes ``max_expanded``."""
    buf = bytearray()
    start = 0  # offset of the line in progress
    number = 1
    overlong = False  # the line in progress passed max_line; its bytes are being discarded
    consumed = 0
    while True:
        try:
            chunk = stream.read(_CHUNK)
        except (OSError, EOFError, zlib.error, zstandard.ZstdError) as err:
            yield _Line(
                number, start, b"", RejectError("io_error", _broken(compression, consumed, err))
            )
            return
        if not chunk:
            break
        bomb = max_expanded is not None and consumed + len(chunk) > max_expanded
        if bomb:
            chunk = chunk[: max_expanded - consumed]
        base = consumed
        consumed += len(chunk)
        pos = 0
        while True:
            nl = chunk.find(b"\n", pos)
            if nl < 0:
                if not overlong:
                    buf += chunk[pos:]
                    if len(buf) > max_line:
                        overlong = True
                        buf.clear()
                break
            if not overlong:
                buf += chunk[pos:nl]
            end = base + nl
            if overlong or len(buf) > max_line:
                yield _Line(number, start, b"", _too_long(end - start, max_line))
            else:
                yield _Line(number, start, bytes(buf))
            buf.clear()
            overlong = False
            start, number, pos = end + 1, number + 1, nl + 1
        if bomb:
            message = (
                f"the {compression} stream expands beyond max_expanded_bytes={max_expanded}; "
                f"line {number} and the rest of the file are dropped"
            )
            yield _Line(number, start, b"", RejectError("decompression_bomb", message))
            return
    if overlong:
        yield _Line(number, start, b"", _too_long(consumed - start, max_line))
    elif buf:
        yield _Line(number, start, bytes(buf))


def _too_long(length: int, max_line: int) -> RejectError:
    return RejectError(
        "json_invalid", f"line is {length} bytes, longer than max_line_bytes={max_line}"
    )


def _broken(compression: str, consumed: int, err: BaseException) -> str:
    what = f"{compression} stream" if compression != "none" else "file"
    return f"the {what} is corrupt or truncated after {consumed} bytes ({err}); the rest is dropped"


def _is_blank(data: bytes) -> bool:
    return not data.strip(b" \t\r")


_DECODER = json_text.STRICT  # strict JSON: no NaN / Infinity
_ENCODER = json_text.CANONICAL  # canonical JSON text of nested values (the ``json`` kind)


def _json_type(value: Any) -> str:
    return {
        "null": "null",
        "bool": "boolean",
        "int": "number",
        "float": "number",
        "string": "string",
    }.get(_kind(value), "array" if isinstance(value, list) else "object")


def _parse(data: bytes, number: int) -> dict[str, Any]:
    """One line as a JSON object, or RejectError (utf8_invalid / json_invalid)."""
    skip = 3 if number == 1 and data.startswith(_BOM) else 0
    try:
        text = data[skip:].decode("utf-8")
    except UnicodeDecodeError as err:
        raise RejectError(
            "utf8_invalid", f"invalid UTF-8 at byte {err.start + skip} of the line: {err.reason}"
        ) from None
    try:
        value = _DECODER.decode(text)
    except RecursionError:
        raise RejectError("json_invalid", "JSON nesting is too deep") from None
    except ValueError as err:
        raise RejectError("json_invalid", f"not valid JSON: {err}") from None
    if not isinstance(value, dict):
        raise RejectError("json_invalid", f"a JSON {_json_type(value)} is not an object")
    if "" in value:
        raise RejectError("json_invalid", 'the empty key "" cannot be a column name')
    return value


# --------------------------------------------------------------------------------------------------
# Records -> typed rows

_Rule = Callable[[Any], tuple[Any, int]]  # value -> (column value, payload bytes), or RejectError


def _short(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)
    return text if len(text) <= 40 else text[:37] + "..."


def _utf8_len(name: str, text: str) -> int:
    if text.isascii():
        return len(text)
    try:
        return len(text.encode("utf-8"))
    except UnicodeEncodeError as err:
        raise RejectError(
            "utf8_invalid", f"field {name!r} holds an unpaired surrogate ({err.reason})"
        ) from None


def _mismatch(name: str, value: Any, expected: str) -> RejectError:
    return RejectError(
        "field_type",
        f"field {name!r} is a {_json_type(value)} ({_short(value)}), but the column is {expected}",
    )


def _rule(feature: Feature) -> _Rule:
    name, dtype = feature.name, feature.dtype
    if not feature.is_scalar or dtype in ("image", "video"):
        raise ShardfeedError(
            f"the jsonl source cannot fill feature {name!r} ({dtype}, shape {list(feature.shape)}): "
            "only scalar bool, integer, float and string features"
        )
    if dtype == "bool":

        def rule(v: Any) -> tuple[Any, int]:
            if isinstance(v, bool):
                return v, 1
            raise _mismatch(name, v, "bool")

    elif dtype.startswith(("int", "uint")):
        info, width = np.iinfo(dtype), np.dtype(dtype).itemsize

        def rule(v: Any) -> tuple[Any, int]:
            if not isinstance(v, int) or isinstance(v, bool):
                raise _mismatch(name, v, dtype)
            if not info.min <= v <= info.max:
                raise RejectError(
                    "field_type", f"field {name!r} = {_short(v)} does not fit {dtype}"
                )
            return v, width

    elif dtype.startswith("float"):
        width = np.dtype(dtype).itemsize

        def rule(v: Any) -> tuple[Any, int]:
            if not isinstance(v, (int, float)) or isinstance(v, bool):
                raise _mismatch(name, v, dtype)
            try:
                return float(v), width
            except OverflowError:
                raise RejectError(
                    "field_type", f"field {name!r} = {_short(v)} does not fit {dtype}"
                ) from None

    elif feature.extra.get("encoding") == "json":

        def rule(v: Any) -> tuple[Any, int]:
            if not isinstance(v, (dict, list)):
                raise _mismatch(name, v, "nested JSON (object or array)")
            try:
                text = _ENCODER.encode(v)
            except ValueError:
                raise RejectError(
                    "json_invalid", f"field {name!r} holds a number out of JSON's range"
                ) from None
            except RecursionError:
                raise RejectError("json_invalid", f"field {name!r} is nested too deeply") from None
            return text, _utf8_len(name, text)

    else:

        def rule(v: Any) -> tuple[Any, int]:
            if not isinstance(v, str):
                raise _mismatch(name, v, "string")
            return v, _utf8_len(name, v)

    return rule


class _Converter:
    """Checks one record against a spec and returns its column values and payload bytes."""

    def __init__(self, spec: FeatureSpec, text_field: str) -> None:
        if text_field not in spec:
            raise ShardfeedError(
                f"the spec has no text field {text_field!r} (features: {spec.names})"
            )
        text = spec[text_field]
        if text.dtype != "string" or text.extra.get("encoding") == "json":
            raise ShardfeedError(f"text field {text_field!r} must be a plain string feature")
        self.text_field = text_field
        self.names = [f.name for f in spec.stored]
        self.rules = [_rule(f) for f in spec.stored]

    def __call__(self, record: Mapping[str, Any]) -> tuple[list[Any], int]:
        text = record.get(self.text_field)
        if text is None:
            state = "null" if self.text_field in record else "missing"
            raise RejectError("field_missing", f"text field {self.text_field!r} is {state}")
        if not isinstance(text, str):
            raise _mismatch(self.text_field, text, "a string (the text field)")
        values, payload = [], 0
        for name, rule in zip(self.names, self.rules, strict=True):
            value = record.get(name)
            if value is None:
                values.append(None)
                continue
            converted, size = rule(value)
            values.append(converted)
            payload += size
        return values, payload


# --------------------------------------------------------------------------------------------------
# The source


class JsonlSource:
    """JSONL reader implementing :class:`~shardfeed.formats.sources.base.SourceReader`.

    ``root`` is a directory (every ``*.jsonl``, ``*.jsonl.gz``, ``*.jsonl.zst`` below it, recursively)
    or a single file (then its parent is the root). Local paths and ``pyarrow.fs`` URIs work.
    ``max_line_bytes`` bounds one line; ``max_expanded_bytes`` bounds a compressed file's
    decompressed size.
    """

    kind: ClassVar[str] = "jsonl"
    #: The combine function for ``infer`` results, reachable from the class (``type(src).merge_inferred``).
    merge_inferred = staticmethod(merge_inferred)
    #: The dataclass ``infer`` returns, rebuilt from its JSON form between pipeline stages.
    inferred_type = InferredSchema

    def __init__(
        self,
        root: str,
        *,
        text_field: str = "text",
        max_line_bytes: int = 64 << 20,  # 64 MiB
        max_expanded_bytes: int = 8 << 30,  # 8 GiB
    ) -> None:
        if not text_field:
            raise ShardfeedError("text_field must be a non-empty key")
        if max_line_bytes <= 0 or max_expanded_bytes <= 0:
            raise ShardfeedError("max_line_bytes and max_expanded_bytes must be positive")
        self.text_field = text_field
        self.max_line_bytes = max_line_bytes
        self.max_expanded_bytes = max_expanded_bytes
        location, self._single = source_root(os.fspath(root), "JSONL source")
        self._location = location
        self.root = location.root

    def __repr__(self) -> str:
        return f"JsonlSource({self.root!r}, text_field={self.text_field!r})"

    # -- files -------------------------------------------------------------------------------------

    def files(self) -> list[str]:
        """Root-relative POSIX paths of the input files, sorted.

        Local directory symlinks are not followed; those that lead outside the root are listed as
        they are, so that ``scan`` reports them as ``path_escape`` (as it does escaping file links).
        """
        if self._single is not None:
            return [self._single]
        return list_files(self._location, lambda path: path.endswith(SUFFIXES))

    def compression(self, file: str) -> str:
        """``"none"``, ``"gzip"`` or ``"zstd"`` (sniffed). Only ``"none"`` files are random access:
        reading refs of a compressed file decompresses it from the start up to the last ref."""
        with self._location.open_input(file, "file") as handle:
            return _sniff(handle.read_at(4, 0))

    @contextlib.contextmanager
    def _open(self, file: str) -> Iterator[tuple[Any, Any, str]]:
        """(raw handle, decompressed stream, compression) of one file."""
        with self._location.open_input(file, "file") as handle:
            compression = _sniff(handle.read_at(4, 0))
            handle.seek(0)  # read_at leaves the implicit position undefined
            if compression == "gzip":
                stream = gzip.GzipFile(fileobj=handle, mode="rb")
            elif compression == "zstd":
                stream = _ZstdReader(handle)
            else:
                stream = handle
            try:
                yield handle, stream, compression
            finally:
                if stream is not handle:
                    stream.close()

    def _lines(self, file: str) -> Iterator[_Line]:
        """Every line of ``file``; a file that cannot be opened is one dropped line at position 0."""
        try:
            with self._open(file) as (_, stream, compression):
                bound = None if compression == "none" else self.max_expanded_bytes
                yield from _iter_lines(stream, compression, self.max_line_bytes, bound)
        except UnsafePathError as err:
            yield _Line(0, 0, b"", RejectError("path_escape", err.message))
        except OSError as err:
            yield _Line(0, 0, b"", RejectError("io_error", f"cannot read the file: {err}"))

    # -- schema ------------------------------------------------------------------------------------

    def infer(self, file: str) -> InferredSchema:
        """Value-kind counts of the valid JSON objects in ``file`` (bad lines do not vote)."""
        fields: dict[str, dict[str, int]] = {}
        records = 0
        for line in self._lines(file):
            if line.error is not None or _is_blank(line.data):
                continue
            try:
                record = _parse(line.data, line.number)
            except RejectError:
                continue
            records += 1
            for name, value in record.items():
                counts = fields.setdefault(name, {})
                kind = _kind(value)
                counts[kind] = counts.get(kind, 0) + 1
        return InferredSchema(records, fields)

    def spec(self, inferred: Any | None = None) -> FeatureSpec:
        """Columns from the merged :class:`InferredSchema`: the text field (string) first, then the
        other keys by name. Raises ShardfeedError if no record has a string text field."""
        if not isinstance(inferred, InferredSchema):
            raise ShardfeedError(
                f"JSONL source {self.root}: no inferred schema ({len(self.files())} input files); "
                "the columns are typed from the data: pass the merged InferredSchema of infer() "
                "over all files"
            )
        text_counts = inferred.fields.get(self.text_field, {})
        if not text_counts.get("string", 0):
            found = ", ".join(sorted(inferred.fields)) or "none"
            where = f"{inferred.records} JSON records" if inferred.records else "no JSON records"
            raise ShardfeedError(
                f"JSONL source {self.root}: the text field {self.text_field!r} holds no string in "
                f"{where} (top-level keys found: {found}); choose the text field with --text-field"
            )
        features = [Feature(self.text_field, "string")]
        for name, kind in sorted(inferred.kinds().items()):
            if name != self.text_field:
                extra = dict(JSON_EXTRA) if kind == "json" else {}
                features.append(Feature(name, KIND_DTYPES[kind], (1,), extra=extra))
        return FeatureSpec(tuple(features))

    def reject_location(self, ref: UnitRef) -> tuple[str, str]:
        """``(source, position)`` naming a unit, as its rejects do: ``(file, "line:N")``."""
        return ref.file, f"line:{ref.position}"

    def meta(self) -> DatasetMeta:
        return DatasetMeta()

    # -- scan and read -----------------------------------------------------------------------------

    def scan(self, file: str, spec: FeatureSpec) -> ScanResult:
        """Validate every line of ``file``: one UnitRef per good record, one RejectRecord per bad one.

        Keys absent from ``spec`` are ignored; keys of ``spec`` absent from a record are null."""
        convert = _Converter(spec, self.text_field)
        result = ScanResult()
        for line in self._lines(file):
            position = f"line:{line.number}" if line.number else ""
            if line.error is not None:
                result.rejects.append(RejectRecord.from_error(file, position, line.error))
                continue
            if _is_blank(line.data):
                continue
            try:
                _, payload = convert(_parse(line.data, line.number))
            except RejectError as err:
                result.rejects.append(RejectRecord.from_error(file, position, err))
                continue
            result.units.append(
                UnitRef(
                    file=file,
                    position=line.number,
                    rows=1,
                    payload_bytes=payload,
                    content_hash=content_digest(line.data),
                    locator=(line.offset, len(line.data)),
                )
            )
        return result

    def read(self, refs: Sequence[UnitRef], spec: FeatureSpec) -> pa.Table:
        """The rows of ``refs`` in the given order, in ``spec.arrow_schema()``.

        Raises ShardfeedError if a line no longer matches its ref's content hash or fails to convert
        (the file changed since ``scan``)."""
        convert = _Converter(spec, self.text_field)
        slots: dict[str, dict[tuple[int, int], list[int]]] = {}  # file -> locator -> ref indices
        for i, ref in enumerate(refs):
            slots.setdefault(ref.file, {}).setdefault(_locator(ref), []).append(i)
        rows: list[list[Any] | None] = [None] * len(refs)
        for file in sorted(slots):  # one file's lines in memory at a time
            for locator, data in self._fetch(file, sorted(slots[file])):
                indices = slots[file][locator]
                digest = content_digest(data)
                for i in indices:
                    if refs[i].content_hash != digest:
                        raise _changed(refs[i])
                ref = refs[indices[0]]
                try:
                    values, _ = convert(_parse(data, ref.position))
                except RejectError as err:
                    raise ShardfeedError(f"{file} line {ref.position}: {err}") from None
                for i in indices:
                    rows[i] = values
        columns: list[list[Any]] = [[] for _ in convert.names]
        for ref, values in zip(refs, rows, strict=True):
            if values is None:
                raise _changed(ref)
            for column, value in zip(columns, values, strict=True):
                column.append(value)
        arrays = {
            f.name: pa.array(column, f.arrow_type)
            for f, column in zip(spec.stored, columns, strict=True)
        }
        return conform(pa.table(arrays), spec)

    def _fetch(
        self, file: str, locators: list[tuple[int, int]]
    ) -> Iterator[tuple[tuple[int, int], bytes]]:
        """The bytes of each (offset, length), sorted by offset."""
        with self._open(file) as (handle, stream, compression):
            if compression == "none":
                yield from _read_ranges(handle, locators)
                return
            wanted = {offset: length for offset, length in locators}
            last = locators[-1][0]
            for line in _iter_lines(
                stream, compression, self.max_line_bytes, self.max_expanded_bytes
            ):
                if line.offset in wanted and line.error is None:
                    yield (line.offset, wanted[line.offset]), line.data
                if line.offset >= last:
                    return


def _changed(ref: UnitRef) -> ShardfeedError:
    return ShardfeedError(
        f"{ref.file} line {ref.position} changed since it was scanned (content hash or offset)"
    )


def _locator(ref: UnitRef) -> tuple[int, int]:
    loc = ref.locator
    if len(loc) != 2 or not all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in loc
    ):
        raise ShardfeedError(f"{ref.file} line {ref.position}: bad jsonl locator {loc!r}")
    return int(loc[0]), int(loc[1])


def _read_ranges(
    handle: Any, ranges: list[tuple[int, int]]
) -> Iterator[tuple[tuple[int, int], bytes]]:
    """Read sorted (offset, length) ranges of a random-access file, coalescing nearby ones."""
    i = 0
    while i < len(ranges):
        start = ranges[i][0]
        end = start + ranges[i][1]
        j = i
        while j + 1 < len(ranges):
            offset, length = ranges[j + 1]
            if offset - end > _COALESCE_GAP or offset + length - start > _COALESCE_SPAN:
                break
            end = max(end, offset + length)
            j += 1
        block = handle.read_at(end - start, start)
        for offset, length in ranges[i : j + 1]:
            yield (offset, length), block[offset - start : offset - start + length]
        i = j + 1
