"""JSONL in blocks: whole lines of a decompressed stream, typed by Arrow's JSON reader at once.

Arrow's reader parses a block of lines many times faster than ``json.loads`` per line, but it is
laxer than strict JSON (``NaN``, two objects on one line, a byte-order mark anywhere, big integers
read as floats, ISO dates read as timestamps) and types a block as a whole. So every block is
checked, cheaply and conservatively: wherever Arrow could disagree with the line parser
(:mod:`~shardfeed.formats.sources.jsonl_lines`), that block, and only that block, is parsed line by
line instead. Both paths give the same rows, payload sizes, content hashes and rejects; the tests
compare them block by block.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json
import zstandard

from shardfeed.formats.columns import conform
from shardfeed.formats.sources.base import content_digest
from shardfeed.formats.sources.jsonl_lines import (
    _CHUNK,
    _broken,
    _Converter,
    _is_blank,
    _kind,
    _Line,
    _parse,
    _too_long,
)
from shardfeed.schemas.features import FeatureSpec
from shardfeed.schemas.rejects import RejectError, RejectRecord

#: decompressed bytes per block: large enough that Arrow's per-call cost vanishes, small enough
#: that a block in flight (raw bytes, parsed columns) stays a few tens of MB
BLOCK_BYTES = 4 << 20

_BOM = b"\xef\xbb\xbf"
_NEWLINE, _SPACE, _TAB, _CR = 10, 32, 9, 13
# Arrow reads an integer beyond int64 as a float, the line parser as an int: a float column with
# a value this large may hold one
_INT64_LIMIT = 2.0**63
#: bytes Arrow's JSON reader parses per task (a block is a few of them, parsed in parallel)
PARSE_CHUNK = 1 << 20
#: at most this many brackets on a line for Arrow to read it (Arrow 25 survives 10,000 levels of
#: nesting and crashes at 50,000; the line parser refuses about 1,000)
_MAX_OPENS = 8_000
_TIMESTAMP_TYPES = (pa.types.is_timestamp, pa.types.is_date)


@dataclass(frozen=True)
class Block:
    """Whole lines of a stream: ``data`` holds them with their newlines (the last line may lack
    one at the end of the stream); ``number`` and ``offset`` are those of the first line."""

    number: int
    offset: int
    data: bytes


def iter_blocks(
    stream: Any,
    compression: str,
    max_line: int,
    max_expanded: int | None,
    block_bytes: int = BLOCK_BYTES,
    chunk_bytes: int = _CHUNK,
    first_number: int = 1,
    first_offset: int = 0,
) -> Iterator[Block | _Line]:
    """The lines of a decompressed stream as blocks of about ``block_bytes``, in stream order, with
    every dropped line (longer than ``max_line``, past ``max_expanded``, a broken stream) as the
    same ``_Line`` error :func:`~shardfeed.formats.sources.jsonl_lines._iter_lines` gives.

    It reads ``chunk_bytes`` at a time, as ``_iter_lines`` does, so a broken stream loses exactly
    the same lines; a line longer than ``max_line`` is dropped without being held whole.
    ``first_number`` and ``first_offset`` are the line number and offset of the stream's first
    byte in its file (a piece of a split file starts past line 1).
    """
    buf = bytearray()  # whole lines, then the line in progress
    complete = 0  # bytes of whole lines at the head of buf
    number, start = first_number, first_offset  # line number and file offset of buf[0]
    overlong = False  # the line in progress passed max_line; its bytes are being dropped
    consumed = 0

    def flush() -> Iterator[Block | _Line]:
        nonlocal complete, number, start
        if complete:
            with memoryview(buf) as whole:  # one copy of the lines, not two
                region = bytes(whole[:complete])
            yield from _segments(region, number, start, max_line)
            number += _newlines(region)
            start += complete
            del buf[:complete]
            complete = 0

    while True:
        try:
            chunk = stream.read(chunk_bytes)
        except (OSError, EOFError, zlib.error, zstandard.ZstdError) as err:
            yield from flush()
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
        if overlong:
            nl = chunk.find(b"\n")
            if nl >= 0:
                end = first_offset + base + nl
                yield _Line(number, start, b"", _too_long(end - start, max_line))
                number, start, overlong = number + 1, end + 1, False
                chunk = chunk[nl + 1 :]
        if not overlong:
            searched = len(buf)
            buf += chunk
            last = buf.rfind(b"\n", searched)
            if last >= 0:
                complete = last + 1
            if len(buf) - complete > max_line:
                yield from flush()
                overlong = True
                buf.clear()
            elif complete >= block_bytes:
                yield from flush()
        if bomb:
            yield from flush()
            message = (
                f"the {compression} stream expands beyond max_expanded_bytes={max_expanded}; "
                f"line {number} and the rest of the file are dropped"
            )
            yield _Line(number, start, b"", RejectError("decompression_bomb", message))
            return
    yield from flush()
    if overlong:
        yield _Line(number, start, b"", _too_long(first_offset + consumed - start, max_line))
    elif buf:
        yield Block(number, start, bytes(buf))


def _segments(region: bytes, number: int, start: int, max_line: int) -> Iterator[Block | _Line]:
    """Whole lines (each ending in a newline) as one block, or as blocks around the lines longer
    than ``max_line``, which are dropped."""
    if len(region) <= max_line:
        yield Block(number, start, region)
        return
    ends = np.flatnonzero(np.frombuffer(region, np.uint8) == _NEWLINE)
    starts = np.concatenate(([0], ends[:-1] + 1))
    head = 0  # first line not yet yielded
    for i in np.flatnonzero(ends - starts > max_line).tolist():
        if i > head:
            a, b = int(starts[head]), int(starts[i])
            yield Block(number + head, start + a, region[a:b])
        length = int(ends[i] - starts[i])
        yield _Line(number + i, start + int(starts[i]), b"", _too_long(length, max_line))
        head = i + 1
    if head < len(starts):
        a = int(starts[head])
        yield Block(number + head, start + a, region[a:])


def iter_block_lines(block: Block) -> Iterator[_Line]:
    """The lines of a block, as ``_iter_lines`` gives them."""
    lines = block.data.split(b"\n")
    if block.data.endswith(b"\n"):
        lines.pop()
    offset = block.offset
    for i, data in enumerate(lines):
        yield _Line(block.number + i, offset, data)
        offset += len(data) + 1


@dataclass(frozen=True)
class _LineTable:
    """Where the lines of a block are: each line's first byte and the offset of its newline (or
    of the block's end)."""

    starts: np.ndarray
    ends: np.ndarray

    @classmethod
    def of(cls, data: bytes) -> _LineTable:
        newlines = np.flatnonzero(np.frombuffer(data, np.uint8) == _NEWLINE)
        ends = newlines if data.endswith(b"\n") else np.append(newlines, len(data))
        return cls(np.concatenate(([0], newlines[: len(ends) - 1] + 1)), ends)

    def any_blank(self, data: bytes) -> bool:
        """Whether a line is blank (``_is_blank``); only a line that is empty or starts with a
        space, tab or carriage return can be, so only those are looked at."""
        octets = np.frombuffer(data, np.uint8)
        empty = self.ends == self.starts
        if empty.any():
            return True
        first = octets[self.starts]
        spaced = np.flatnonzero((first == _SPACE) | (first == _TAB) | (first == _CR))
        return any(_is_blank(data[self.starts[i] : self.ends[i]]) for i in spaced.tolist())

    def any_deep(self, data: bytes) -> bool:
        """Whether a line opens more than ``_MAX_OPENS`` brackets (a bound on its depth); only
        lines longer than that are counted."""
        long = np.flatnonzero(self.ends - self.starts > _MAX_OPENS)
        for a, b in zip(self.starts[long].tolist(), self.ends[long].tolist(), strict=True):
            if data.count(b"{", a, b) + data.count(b"[", a, b) > _MAX_OPENS:
                return True
        return False


def _trusted_read(data: bytes, schema: pa.Schema | None) -> tuple[pa.Table, _LineTable] | None:
    """Arrow's reading of a block with its line table, where it agrees with the line parser.

    Refused before reading: a byte-order mark or invalid UTF-8 (Arrow checks neither), a blank
    line (Arrow skips it, so rows and lines no longer pair up), and a line that might nest too
    deeply (Arrow's reader recurses per level and crashes the process on tens of thousands).
    Refused after: whatever Arrow refuses, another row count than lines (two objects on one line),
    and a column for the key ``""``, which the line parser rejects."""
    if _has_bom(data) or not _valid_utf8(data):
        return None
    lines = _LineTable.of(data)
    if lines.any_blank(data) or lines.any_deep(data):
        return None
    longest = int((lines.ends - lines.starts).max()) if len(lines.starts) else 0
    table = _arrow_read(data, schema, longest)
    if table is None or table.num_rows != len(lines.starts) or "" in table.column_names:
        return None
    return table, lines


def _newlines(data: bytes) -> int:
    """How many newlines ``data`` holds (numpy: a third of ``bytes.count``'s time, here)."""
    return int(np.count_nonzero(np.frombuffer(data, np.uint8) == _NEWLINE))


def _has_bom(data: bytes) -> bool:
    """Whether a UTF-8 byte-order mark is anywhere in ``data``: its first byte's few places checked
    with numpy (``bytes.__contains__`` took eight times as long, holding the GIL)."""
    octets = np.frombuffer(data, np.uint8)
    at = np.flatnonzero(octets[: len(octets) - 2] == _BOM[0])
    return bool(((octets[at + 1] == _BOM[1]) & (octets[at + 2] == _BOM[2])).any())


def _valid_utf8(data: bytes) -> bool:
    """Whether ``data`` is valid UTF-8, by Arrow's validation of it as one string, in place and
    without the GIL (``bytes.decode`` built a str of the whole block). Agrees with Python's
    decoder on surrogates, overlong forms, code points past U+10FFFF and cut sequences (tested)."""
    offsets = pa.py_buffer(np.array([0, len(data)], np.int64))
    text = pa.Array.from_buffers(pa.large_string(), 1, [None, offsets, pa.py_buffer(data)])
    try:
        text.validate(full=True)
    except pa.ArrowInvalid:
        return False
    return True


def _arrow_read(data: bytes, schema: pa.Schema | None, longest: int) -> pa.Table | None:
    """``data`` through Arrow's JSON reader, or None where it refuses it. Arrow parses chunks of
    about ``PARSE_CHUNK`` on its own threads (both cores: the parse was a tenth of a text run)
    and unifies their inferred types as one chunk's (ints with floats, nulls, timestamps with
    text; tested); a chunk is never smaller than the ``longest`` line, which it must hold."""
    block_size = max(PARSE_CHUNK, longest + 2)
    options = pa_json.ReadOptions(use_threads=True, block_size=block_size)
    parse = pa_json.ParseOptions(explicit_schema=schema, newlines_in_values=False)
    try:
        return pa_json.read_json(pa.BufferReader(data), read_options=options, parse_options=parse)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        return None


# --------------------------------------------------------------------------------------------------
# Schema inference over a block


@dataclass
class KindCounts:
    """Per-key value-kind counts and the number of JSON objects, as ``infer`` sums them."""

    records: int = 0
    fields: dict[str, dict[str, int]] = field(default_factory=dict)

    def add(self, name: str, kind: str, n: int) -> None:
        counts = self.fields.setdefault(name, {})
        counts[kind] = counts.get(kind, 0) + n


#: Arrow's reading of a block with no schema (``inferred_read``): the table and its line table
InferredRead = tuple[pa.Table, "_LineTable"] | None


def inferred_read(block: Block) -> InferredRead:
    """Arrow's reading of ``block`` with the types it infers, where it agrees with the line
    parser; one reading serves both :func:`count_kinds` and :meth:`BlockTyper.rows`."""
    return _trusted_read(block.data, None)


def count_kinds(block: Block, counts: KindCounts, read: InferredRead | bool = True) -> None:
    """Add the value kinds of ``block``'s valid JSON objects to ``counts`` (bad lines do not vote).

    From Arrow's column types where Arrow agrees with the line parser: ``null`` then also counts
    records without the key (nulls never vote, so kinds are the same either way). ``read``: the
    block's :func:`inferred_read` when the caller has it (True: read it here)."""
    if read is True:
        read = inferred_read(block)
    if read:
        table = read[0]
        kinds = [_arrow_kind(f.type) for f in table.schema]
        floats = [table.column(i) for i, kind in enumerate(kinds) if kind == "float"]
        if None not in kinds and all(_finite(c) and _below(c, _INT64_LIMIT) for c in floats):
            counts.records += table.num_rows
            for name, kind, column in zip(table.column_names, kinds, table.columns, strict=True):
                valid = len(column) - column.null_count
                if valid and kind != "null":
                    counts.add(name, kind, valid)
                if column.null_count:
                    counts.add(name, "null", column.null_count)
            return
    for line in iter_block_lines(block):
        if _is_blank(line.data):
            continue
        try:
            record = _parse(line.data, line.number)
        except RejectError:
            continue
        counts.records += 1
        for name, value in record.items():
            counts.add(name, _kind(value), 1)


def _below(column: pa.ChunkedArray, limit: float) -> bool:
    """Every value of a float column is smaller than ``limit`` in magnitude."""
    largest = pc.max(pc.abs(column)).as_py()
    return largest is None or largest < limit


def _arrow_kind(atype: pa.DataType) -> str | None:
    """The line parser's kind of an Arrow JSON column type; None for nested types, whose depth and
    missing members Arrow's struct inference hides (those blocks go line by line)."""
    if pa.types.is_boolean(atype):
        return "bool"
    if pa.types.is_int64(atype):
        return "int"
    if pa.types.is_float64(atype):
        return "float"
    if pa.types.is_string(atype) or any(test(atype) for test in _TIMESTAMP_TYPES):
        return "string"
    if pa.types.is_null(atype):
        return "null"
    return None


def _widened(column: pa.ChunkedArray, atype: pa.DataType) -> pa.ChunkedArray | None:
    """``column`` as ``atype`` where the reading with ``atype`` as the schema gives the same
    values: all nulls, or integers that are exact as doubles (Arrow's parse of ``5`` as a double
    is ``5.0``); None otherwise."""
    if column.type == atype:
        return column
    if pa.types.is_null(column.type):
        return pa.chunked_array([pa.nulls(len(column), atype)])
    if pa.types.is_int64(column.type) and pa.types.is_float64(atype):
        try:  # a safe cast refuses an integer beyond 2**53, which a double cannot hold
            return column.cast(atype)
        except pa.ArrowInvalid:
            return None
    return None


def _finite(column: pa.ChunkedArray) -> bool:
    """No NaN or infinity: Arrow reads the ``NaN``/``Infinity`` literals strict JSON refuses."""
    return bool(pc.all(pc.is_finite(column)).as_py() is not False)


# --------------------------------------------------------------------------------------------------
# Typed rows of a block


@dataclass
class BlockRows:
    """The good records of one or more blocks, typed to a spec, with one entry per row in each
    array, plus the rejects among them in line order."""

    numbers: np.ndarray  # 1-based line numbers
    offsets: np.ndarray  # stream offsets of the lines
    lengths: np.ndarray  # line lengths in bytes, without the newline
    payload: np.ndarray  # payload bytes of each row (``_Converter``'s sizes)
    hashes: list[str]  # content digest of each line (``content_digest``)
    table: pa.Table  # the rows, in the spec's Arrow schema
    rejects: list[RejectRecord]

    @classmethod
    def concat(
        cls, parts: Sequence[BlockRows], spec: FeatureSpec, rejects: Sequence[RejectRecord] = ()
    ) -> BlockRows:
        """The parts one after another (no part: no rows), then ``rejects``."""
        if not parts:
            empty = np.zeros(0, np.int64)
            table = spec.arrow_schema().empty_table()
            return cls(empty, empty, empty, empty, [], table, list(rejects))
        return cls(
            *(np.concatenate([getattr(p, name) for p in parts]) for name in _ARRAYS),
            [h for p in parts for h in p.hashes],
            pa.concat_tables([p.table for p in parts]),
            [r for p in parts for r in p.rejects] + list(rejects),
        )


_ARRAYS = ("numbers", "offsets", "lengths", "payload")


class BlockTyper:
    """Types the records of JSONL blocks to ``spec`` (as ``_Converter`` does, line by line)."""

    def __init__(self, spec: FeatureSpec, text_field: str, file: str) -> None:
        self.convert = _Converter(spec, text_field)
        self.spec, self.text_field, self.file = spec, text_field, file
        self.schema = spec.arrow_schema()
        # nested values are stored as canonical JSON text, which only the line parser writes
        self.arrow_ok = not any(f.extra.get("encoding") == "json" for f in spec.stored)
        self.widths = {
            f.name: 0 if f.dtype == "string" else np.dtype(f.dtype).itemsize for f in spec.stored
        }
        #: blocks typed by Arrow and line by line (for tests and progress)
        self.arrow_blocks = 0
        self.line_blocks = 0

    def rows(self, block: Block, inferred: InferredRead = None) -> BlockRows:
        """The block's good records and its rejects. ``inferred``: the block's
        :func:`inferred_read`, used as is where its types are the spec's (or widen to them
        losslessly), which saves a second parse."""
        rows = None
        if self.arrow_ok:
            if inferred:
                rows = self._typed(block, *inferred)
            if rows is None:
                read = _trusted_read(block.data, self.schema)
                rows = None if read is None else self._typed(block, *read)
        if rows is None:
            self.line_blocks += 1
            return self._line_rows(block)
        self.arrow_blocks += 1
        return rows

    def _typed(self, block: Block, table: pa.Table, lines: _LineTable) -> BlockRows | None:
        """The rows of an Arrow reading of ``block`` in the spec's schema; None where a column
        is of another type (then the caller reads with the spec's schema, or line by line)."""
        data = block.data
        columns, payload = [], np.zeros(table.num_rows, np.int64)
        for f in self.schema:
            if f.name not in table.column_names:
                columns.append(pa.nulls(table.num_rows, f.type))
                continue
            column = _widened(table.column(f.name), f.type)
            if column is None:
                return None
            if pa.types.is_floating(f.type) and not _finite(column):
                return None
            if f.name == self.text_field and column.null_count:
                return None  # field_missing rejects: their messages come from the line path
            width = self.widths[f.name]
            if width:
                valid = np.asarray(pc.is_valid(column).combine_chunks(), dtype=bool)
                payload += valid * width
            else:
                sizes = pc.fill_null(pc.binary_length(column), 0)
                payload += np.asarray(sizes.combine_chunks(), dtype=np.int64)
            columns.append(column)
        if self.text_field not in table.column_names:
            return None
        starts, ends = lines.starts, lines.ends
        view = memoryview(data)
        hashes = [
            content_digest(view[a:b]) for a, b in zip(starts.tolist(), ends.tolist(), strict=True)
        ]
        return BlockRows(
            numbers=block.number + np.arange(len(starts), dtype=np.int64),
            offsets=block.offset + starts,
            lengths=ends - starts,
            payload=payload,
            hashes=hashes,
            table=pa.Table.from_arrays(columns, schema=self.schema),
            rejects=[],
        )

    def _line_rows(self, block: Block) -> BlockRows:
        numbers, offsets, lengths, payload, hashes = [], [], [], [], []
        values: list[list[Any]] = []
        rejects = []
        for line in iter_block_lines(block):
            if _is_blank(line.data):
                continue
            try:
                row, size = self.convert(_parse(line.data, line.number))
            except RejectError as err:
                rejects.append(RejectRecord.from_error(self.file, f"line:{line.number}", err))
                continue
            numbers.append(line.number)
            offsets.append(line.offset)
            lengths.append(len(line.data))
            payload.append(size)
            hashes.append(content_digest(line.data))
            values.append(row)
        columns = list(zip(*values, strict=True)) if values else [[] for _ in self.schema]
        arrays = [pa.array(list(c), f.type) for f, c in zip(self.schema, columns, strict=True)]
        return BlockRows(
            *(np.asarray(a, np.int64) for a in (numbers, offsets, lengths, payload)),
            hashes,
            conform(pa.Table.from_arrays(arrays, schema=self.schema), self.spec),
            rejects,
        )
