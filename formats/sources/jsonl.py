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
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import pyarrow as pa

from shardfeed.formats.columns import conform
from shardfeed.formats.sources.base import (
    DatasetMeta,
    RowsScan,
    ScanResult,
    UnitRef,
    content_digest,
)
from shardfeed.formats.sources.drift import (
    EXAMPLE_FILES,
    describe,
    drifts,
    example_files,
    file_majority,
    merge_counts,
    merge_example_files,
)
from shardfeed.formats.sources.jsonl_blocks import (
    BLOCK_BYTES,
    Block,
    BlockRows,
    BlockTyper,
    KindCounts,
    count_kinds,
    inferred_read,
    iter_blocks,
)
from shardfeed.formats.sources.jsonl_lines import (
    _Converter,
    _iter_lines,
    _Line,
    _parse,
    _sniff,
    _ZstdReader,
)
from shardfeed.formats.sources.line_ranges import LineRangeReader, byte_ranges
from shardfeed.formats.sources.listing import list_files, source_root
from shardfeed.schemas.errors import ShardfeedError, UnsafePathError
from shardfeed.schemas.features import Feature, FeatureSpec
from shardfeed.schemas.rejects import RejectError, RejectRecord

__all__ = [
    "ANY_JSON_EXTRA",
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
#: ... and for a key whose kind differs across files, kept as JSON text of any value under
#: ``--unify-schemas`` (lossless: ``"7"`` and ``7`` stay apart)
ANY_JSON_EXTRA = {"encoding": "json", "unified": "any"}
#: how a kind votes in the drift check: JSON has one number type, so ints and floats agree
_VOTE = {"int": "number", "float": "number"}

SUFFIXES = (".jsonl", ".jsonl.gz", ".jsonl.zst")
#: a piece of a file: the lines starting in bytes ``[start, stop)`` (-1: to the end), the first
#: of them line number ``first``; the whole file is ``WHOLE``
Piece = tuple[int, int, int]
WHOLE: Piece = (0, -1, 1)
#: decompressed bytes at the head of a piece that the fused scan's first guess of the schema
#: comes from (``sample_piece``); a block is at least one read of the stream (1 MiB), so less
#: samples that much
SAMPLE_BYTES = 1 << 20
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
    #: ``files[key][kind]``: example files holding that kind (for drift messages)
    files: Mapping[str, Mapping[str, Sequence[str]]] = field(default_factory=dict)
    #: ``majors[key][vote]``: how many files (or pieces) hold mostly that kind of value
    majors: Mapping[str, Mapping[str, int]] = field(default_factory=dict)

    def kinds(self) -> dict[str, str]:
        """The resolved kind of every key (keys holding only nulls become ``string``)."""
        return {name: resolve_kind(counts) for name, counts in self.fields.items()}

    def drift(self, name: str) -> str | None:
        """The drift message of key ``name`` when files disagree on its kind (numbers, text,
        booleans, nested values) beyond stray records; None otherwise."""
        counts = self.fields.get(name, {})
        votes: dict[str, int] = {}
        examples: dict[str, set[str]] = {}
        for kind, n in counts.items():
            if kind in KINDS and n:
                vote = _VOTE.get(kind, kind)
                votes[vote] = votes.get(vote, 0) + n
                examples.setdefault(vote, set()).update(self.files.get(name, {}).get(kind, []))
        winner = _vote(counts)
        if len(votes) < 2 or not drifts(votes, winner, self.majors.get(name, {})):
            return None
        named = {vote: sorted(files)[:EXAMPLE_FILES] for vote, files in examples.items()}
        remedy = "pass --unify-schemas to keep its values as JSON text"
        return describe(name, dict(sorted(votes.items())), named, remedy)


def merge_inferred(a: InferredSchema, b: InferredSchema) -> InferredSchema:
    """Sum two fragments' counts; associative and commutative, with ``InferredSchema()`` as identity."""
    return InferredSchema(
        a.records + b.records,
        merge_counts(a.fields, b.fields),
        merge_example_files(a.files, b.files),
        merge_counts(a.majors, b.majors),
    )


def _inferred(file: str, counts: KindCounts) -> InferredSchema:
    voting = {
        name: {k: n for k, n in held.items() if k in KINDS} for name, held in counts.fields.items()
    }
    return InferredSchema(
        counts.records,
        counts.fields,
        example_files(file, counts.fields),
        file_majority(voting, _vote),
    )


def _vote(counts: Mapping[str, int]) -> str:
    """The drift vote of a key's resolved kind (numbers are one vote)."""
    kind = resolve_kind(counts)
    return _VOTE.get(kind, kind)


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
    first_position: ClassVar[int] = 1  # a unit's position is its line number
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
        unify_schemas: bool = False,
    ) -> None:
        if not text_field:
            raise ShardfeedError("text_field must be a non-empty key")
        if max_line_bytes <= 0 or max_expanded_bytes <= 0:
            raise ShardfeedError("max_line_bytes and max_expanded_bytes must be positive")
        self.text_field = text_field
        self.unify_schemas = unify_schemas
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

    def _blocks(
        self, file: str, piece: Piece = WHOLE, block_bytes: int = BLOCK_BYTES
    ) -> Iterator[Block | _Line]:
        """``file`` (or the lines starting in one piece of it) in blocks of whole lines
        (``jsonl_blocks.iter_blocks``), with its dropped lines; a file that cannot be opened is
        one dropped line at position 0 (in its first piece only)."""
        start, stop, first = piece
        try:
            with self._open(file) as (handle, stream, compression):
                bound = None if compression == "none" else self.max_expanded_bytes
                if (start, stop) == (0, -1):
                    yield from iter_blocks(
                        stream, compression, self.max_line_bytes, bound, block_bytes
                    )
                    return
                if compression != "none":
                    raise ShardfeedError(f"{file}: a {compression} file cannot be read in pieces")
                lines = LineRangeReader(handle, start, stop)
                yield from iter_blocks(
                    lines,
                    compression,
                    self.max_line_bytes,
                    None,
                    block_bytes,
                    first_number=first,
                    first_offset=lines.start,
                )
        except UnsafePathError as err:
            if start == 0:
                yield _Line(0, 0, b"", RejectError("path_escape", err.message))
        except OSError as err:
            if start == 0:
                yield _Line(0, 0, b"", RejectError("io_error", f"cannot read the file: {err}"))

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
        counts = KindCounts()
        for item in self._blocks(file):
            if isinstance(item, Block):
                count_kinds(item, counts)
        return _inferred(file, counts)

    # -- pieces of a large file (``SplittableSource``) ----------------------------------------

    def pieces(self, file: str, piece_bytes: int) -> list[tuple[int, int]]:
        """Byte ranges of ``file`` for separate scan tasks (``line_ranges.byte_ranges``); a
        compressed file is one piece, since a gzip or zstd stream is read from its start."""
        try:
            with self._location.open_input(file, "file") as handle:
                size = handle.size()
                if size <= piece_bytes or _sniff(handle.read_at(4, 0)) != "none":
                    return [WHOLE[:2]]
        except (OSError, UnsafePathError):
            return [WHOLE[:2]]  # the scan reports it
        return byte_ranges(size, piece_bytes)

    def infer_piece(self, file: str, start: int, stop: int) -> tuple[InferredSchema, int]:
        """``infer`` over the lines starting in ``[start, stop)``, and how many lines start
        there (so later pieces know their first line number)."""
        if (start, stop) == WHOLE[:2]:
            return self.infer(file), 0
        counts = KindCounts()
        with self._location.open_input(file, "file") as handle:
            lines = LineRangeReader(handle, start, stop)
            for item in iter_blocks(lines, "none", self.max_line_bytes, None):
                if isinstance(item, Block):
                    count_kinds(item, counts)
            return _inferred(file, counts), lines.lines()

    def sample_piece(self, file: str, start: int, stop: int) -> tuple[InferredSchema, int]:
        """A first guess at the piece's share of ``infer``: the kinds in its first
        :data:`SAMPLE_BYTES` (:class:`InferringScan` then counts them all), and, exactly as
        ``infer_piece`` does, how many lines start in it (0 for a whole file)."""
        if (start, stop) == WHOLE[:2]:
            return _inferred(file, _head_counts(self._blocks(file, block_bytes=SAMPLE_BYTES))), 0
        with self._location.open_input(file, "file") as handle:
            lines = LineRangeReader(handle, start, stop)
            blocks = iter_blocks(lines, "none", self.max_line_bytes, None, SAMPLE_BYTES)
            return _inferred(file, _head_counts(blocks)), lines.lines()

    def scan_inferring(
        self, file: str, spec: FeatureSpec | None, start: int, stop: int, first: int
    ) -> InferringScan:
        """``scan_piece`` that also counts the piece's share of ``infer`` from the same Arrow
        readings (``spec`` None: only counts)."""
        return InferringScan(self, file, spec, (start, stop, first))

    def scan_piece(
        self, file: str, spec: FeatureSpec, start: int, stop: int, first: int
    ) -> Iterator[RowsScan]:
        """``scan_rows`` over the lines starting in ``[start, stop)``, the first of them line
        ``first`` of the file."""
        for part in self._typed_blocks(file, spec, (start, stop, first)):
            yield RowsScan.one_row_each(
                part.numbers, part.payload, part.hashes, part.table, part.rejects
            )

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
            if name == self.text_field:  # the text field is a string: other values are rejects
                continue
            drift = inferred.drift(name)
            if drift is not None:
                if not self.unify_schemas:
                    raise ShardfeedError(f"JSONL source {self.root}: {drift}")
                features.append(Feature(name, "string", (1,), extra=dict(ANY_JSON_EXTRA)))
                continue
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
        """Validate every line of ``file``: one UnitRef per good record (its locator the line's
        ``(offset, length)`` in the decompressed stream), one RejectRecord per bad one.

        Keys absent from ``spec`` are ignored; keys of ``spec`` absent from a record are null."""
        result = ScanResult()
        for part in self._typed_blocks(file, spec):
            result.rejects.extend(part.rejects)
            columns = (part.numbers, part.payload, part.offsets, part.lengths)
            for (number, payload, offset, length), digest in zip(
                zip(*(c.tolist() for c in columns), strict=True), part.hashes, strict=True
            ):
                result.units.append(UnitRef(file, number, 1, payload, digest, (offset, length)))
        return result

    def scan_rows(self, file: str, spec: FeatureSpec) -> Iterator[RowsScan]:
        """The good records of ``file`` block by block, typed to ``spec``, with the rejects
        (:class:`~shardfeed.formats.sources.base.SpoolingSource`): the file is decoded once."""
        for part in self._typed_blocks(file, spec):
            yield RowsScan.one_row_each(
                part.numbers, part.payload, part.hashes, part.table, part.rejects
            )

    def _typed_blocks(
        self, file: str, spec: FeatureSpec, piece: Piece = WHOLE
    ) -> Iterator[BlockRows]:
        """Each block's typed rows and rejects; a dropped line is a part with one reject."""
        typer = BlockTyper(spec, self.text_field, file)
        for item in self._blocks(file, piece):
            yield typer.rows(item) if isinstance(item, Block) else _dropped(file, item, spec)

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


class InferringScan:
    """One piece scanned and inferred in a single pass: iterating yields its rows typed to
    ``spec`` (nothing when None) while the kinds of every block are counted from the Arrow
    reading that typed it; :meth:`inferred` is then the piece's share of ``infer``."""

    def __init__(
        self, source: JsonlSource, file: str, spec: FeatureSpec | None, piece: Piece
    ) -> None:
        self._source, self._file, self._spec, self._piece = source, file, spec, piece
        self._counts = KindCounts()

    def __iter__(self) -> Iterator[RowsScan]:
        file, spec = self._file, self._spec
        typer = None if spec is None else BlockTyper(spec, self._source.text_field, file)
        for item in self._source._blocks(file, self._piece):
            if isinstance(item, Block):
                read = inferred_read(item)
                count_kinds(item, self._counts, read)
                part = None if typer is None else typer.rows(item, read)
            else:
                part = None if spec is None else _dropped(file, item, spec)
            if part is not None:
                yield RowsScan.one_row_each(
                    part.numbers, part.payload, part.hashes, part.table, part.rejects
                )

    def inferred(self) -> InferredSchema:
        """The counts of the blocks iterated so far (all of them, once iteration ended)."""
        return _inferred(self._file, self._counts)


def _head_counts(items: Iterable[Block | _Line]) -> KindCounts:
    """The kinds of the first block among ``items`` (a guess's sample); the rest is not read."""
    counts = KindCounts()
    for item in items:
        if isinstance(item, Block):
            count_kinds(item, counts)
            break
    return counts


def _dropped(file: str, line: _Line, spec: FeatureSpec) -> BlockRows:
    """A line the block reader dropped (too long, a broken stream, an unreadable file) as a
    part with one reject and no rows."""
    position = f"line:{line.number}" if line.number else ""
    reject = RejectRecord.from_error(file, position, line.error)
    return BlockRows.concat([], spec, rejects=[reject])


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
