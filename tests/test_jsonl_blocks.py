"""JSONL blocks: the block splitter gives the line splitter's lines, and Arrow's typing of a block
gives exactly what the line parser gives (rows, sizes, hashes, rejects), or hands the block over.
"""

from __future__ import annotations

import gzip
import io
import json

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from shardfeed.formats.sources.jsonl import InferredSchema, JsonlSource
from shardfeed.formats.sources.jsonl_blocks import (
    PARSE_CHUNK,
    Block,
    BlockTyper,
    KindCounts,
    _has_bom,
    _newlines,
    _trusted_read,
    _valid_utf8,
    count_kinds,
    inferred_read,
    iter_block_lines,
    iter_blocks,
)
from shardfeed.formats.sources.jsonl_lines import _iter_lines, _Line
from shardfeed.schemas.features import Feature, FeatureSpec

SPEC = FeatureSpec(
    (
        Feature("text", "string"),
        Feature("flag", "bool", (1,)),
        Feature("n", "int64", (1,)),
        Feature("x", "float64", (1,)),
        Feature("tag", "string", (1,)),
    )
)

# values of every kind, including those Arrow reads otherwise than strict JSON does
_VALUE = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=12),
    st.sampled_from(["2020-01-01", "2021-03-04T05:06:07Z", "\U0001f600", "\x00", ""]),
    st.lists(st.integers(0, 3), max_size=3),
    st.dictionaries(st.sampled_from("ab"), st.integers(0, 3), max_size=2),
)
_RECORD = st.dictionaries(st.sampled_from(["text", "flag", "n", "x", "tag", "other"]), _VALUE)
_HOSTILE = st.sampled_from(
    [
        b"",
        b"   ",
        b"\t\r",
        b'{"text": "a"}{"text": "b"}',
        b'{"text": "a", "text": "b"}',
        b'{"text": NaN}',
        b'{"text": "x", "x": Infinity}',
        b'{"text": "x", "x": 1e400}',
        b'{"text": "\\ud800"}',
        b'{"text": "caf\xe9"}',
        b"\xef\xbb\xbf" + b'{"text": "bom"}',
        b'{"": 1, "text": "e"}',
        b"[1, 2]",
        b"7",
        b'{"text": "unterminated',
        b'{"text": "t", "n": 99999999999999999999}',
        b'{"text": "t", "n": 1.0}',
        b'{"text": "t\tab"}',
        b' {"text": "leading space"}',
        b'{"text": "' + b"[" * 40 + b'"}',
    ]
)
_LINE = st.one_of(_RECORD.map(lambda r: json.dumps(r, ensure_ascii=False).encode()), _HOSTILE)


def _lines_of(items: list) -> list[tuple[int, int, bytes, str | None]]:
    out = []
    for item in items:
        lines = iter_block_lines(item) if isinstance(item, Block) else [item]
        for line in lines:
            error = None if line.error is None else f"{line.error.reason}: {line.error.message}"
            out.append((line.number, line.offset, line.data, error))
    return out


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.one_of(_LINE, st.binary(max_size=40).filter(lambda b: b"\n" not in b)), max_size=30
    ),
    st.booleans(),
    st.integers(1, 64),
    st.integers(1, 200),
    st.integers(8, 120),
    st.one_of(st.none(), st.integers(0, 600)),
)
def test_blocks_hold_exactly_the_lines(lines, final_newline, chunk, block, max_line, bound) -> None:
    """Whatever the chunk, block and line bounds, the blocks' lines and dropped lines are those
    of the line splitter, in order (overlong lines, a decompression bound, no final newline)."""
    data = b"\n".join(lines) + (b"\n" if final_newline else b"")

    class Chunked(io.BytesIO):
        def read(self, size: int = -1) -> bytes:
            return super().read(min(size, chunk))

    expected = [
        (line.number, line.offset, line.data, None if line.error is None else line.error.message)
        for line in _iter_lines(Chunked(data), "gzip", max_line, bound)
    ]
    got = _lines_of(list(iter_blocks(Chunked(data), "gzip", max_line, bound, block, chunk)))
    assert [(n, o, d, e and e.split(": ", 1)[1]) for n, o, d, e in got] == expected


def test_a_broken_stream_loses_the_same_lines() -> None:
    """A truncated gzip stream: the lines before the break, then one io_error, as line by line."""
    noise = np.random.default_rng(0).integers(0, 2**63, 40_000).tolist()
    body = b"".join(json.dumps({"text": f"doc {n:x}" * 4}).encode() + b"\n" for n in noise)
    broken = gzip.compress(body)[:-4000]
    want = [
        (x.number, x.data, x.error and x.error.reason)
        for x in _iter_lines(gzip.GzipFile(fileobj=io.BytesIO(broken)), "gzip", 1 << 20, None)
    ]
    blocks = iter_blocks(gzip.GzipFile(fileobj=io.BytesIO(broken)), "gzip", 1 << 20, None, 1 << 16)
    got = [(n, d, e and e.split(":")[0]) for n, _, d, e in _lines_of(list(blocks))]
    assert got == want
    assert want[-1][2] == "io_error" and 0 < len(want) - 1 < 40_000


def _all_paths(lines: list[bytes]) -> tuple[object, object, object]:
    """The block typed from Arrow's reading with the spec's schema, from its reading with
    inferred types (the fused scan's), and line by line; None where an Arrow path declines."""
    data = b"\n".join(lines) + b"\n"
    block = Block(1, 0, data)
    typer = BlockTyper(SPEC, "text", "f.jsonl")
    explicit = _trusted_read(data, typer.schema)
    inferred = inferred_read(block)
    return (
        explicit and typer._typed(block, *explicit),
        inferred and typer._typed(block, *inferred),
        typer._line_rows(block),
    )


def _both_paths(lines: list[bytes]) -> tuple[object, object]:
    explicit, _, slow = _all_paths(lines)
    return explicit, slow


def _same(fast, slow) -> None:
    for name in ("numbers", "offsets", "lengths", "payload"):
        np.testing.assert_array_equal(getattr(fast, name), getattr(slow, name), err_msg=name)
    assert fast.hashes == slow.hashes
    assert fast.table.schema == slow.table.schema
    assert fast.table.to_pylist() == slow.table.to_pylist()
    assert [r.to_json() for r in fast.rejects] == [r.to_json() for r in slow.rejects]


@settings(max_examples=300, deadline=None)
@given(st.lists(_LINE, min_size=1, max_size=12))
def test_arrow_typing_agrees_with_the_line_parser(lines: list[bytes]) -> None:
    """Where Arrow's reading of a block is used, it is the line parser's, value for value; where
    they could differ (every hostile line above), the block goes line by line."""
    explicit, inferred, slow = _all_paths(lines)
    for fast in (explicit, inferred):
        if fast is not None:
            _same(fast, slow)
            assert not slow.rejects  # Arrow's path is only ever taken by blocks without rejects


def test_typical_blocks_take_arrows_path() -> None:
    """The fast path is really taken: plain records, mixed nulls and missing keys."""
    records = [
        {"text": "a", "n": 1, "x": 2, "flag": True},
        {"text": "b\u00e9", "x": 1.5, "tag": None},
        {"text": "2020-01-01", "tag": "2020-01-01T00:00:00Z", "n": -(2**63)},
    ]
    fast, slow = _both_paths([json.dumps(r).encode() for r in records])
    assert fast is not None
    _same(fast, slow)
    assert fast.table.column("text").to_pylist() == ["a", "b\u00e9", "2020-01-01"]


def test_one_bad_line_is_one_reject_and_only_its_block_goes_line_by_line(tmp_path) -> None:
    """A good file of several blocks with one broken line: exactly one reject (with its line
    number), every other line kept, and only that block parsed line by line."""
    lines = [json.dumps({"text": f"document {i}", "n": i}).encode() for i in range(3000)]
    lines[1500] = b'{"text": "broken", "n": '
    (tmp_path / "a.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    source = JsonlSource(tmp_path / "a.jsonl")
    spec = source.spec(source.infer("a.jsonl"))
    typer = BlockTyper(spec, "text", "a.jsonl")
    parts = []
    with open(tmp_path / "a.jsonl", "rb") as handle:
        for item in iter_blocks(handle, "none", 1 << 20, None, 16 << 10, chunk_bytes=4096):
            parts.append(typer.rows(item))
    rejects = [r for p in parts for r in p.rejects]
    assert [(r.position, r.reason) for r in rejects] == [("line:1501", "json_invalid")]
    numbers = np.concatenate([p.numbers for p in parts])
    assert numbers.tolist() == [n for n in range(1, 3001) if n != 1501]
    texts = [t for p in parts for t in p.table.column("text").to_pylist()]
    assert texts == [f"document {i}" for i in range(3000) if i != 1500]
    assert typer.line_blocks == 1 and typer.arrow_blocks == len(parts) - 1 >= 4
    # the source's own scan gives the same rejects and units
    scanned = source.scan("a.jsonl", spec)
    assert [r.position for r in scanned.rejects] == ["line:1501"]
    assert [u.position for u in scanned.units] == numbers.tolist()


@settings(max_examples=200, deadline=None)
@given(st.lists(_LINE, min_size=1, max_size=12))
def test_inference_counts_resolve_as_the_line_parser_does(lines: list[bytes]) -> None:
    """Arrow's kind counts of a block give the same kinds and record count as the line parser's
    (``null`` may also count absent keys: it never votes)."""
    block = Block(1, 0, b"\n".join(lines) + b"\n")
    fast = KindCounts()
    count_kinds(block, fast)
    slow = KindCounts()
    for line in iter_block_lines(block):
        count_kinds(Block(line.number, line.offset, line.data + b"\n"), slow)
    a, b = InferredSchema(fast.records, fast.fields), InferredSchema(slow.records, slow.fields)
    assert a.records == b.records
    assert a.kinds() == b.kinds()


def test_deep_nesting_never_reaches_arrow() -> None:
    """Arrow's reader crashes the process on very deep nesting; such a line goes line by line
    (and is rejected there) instead."""
    deep = b'{"text": "x", "tag": ' + b"[" * 60_000 + b"]" * 60_000 + b"}"
    typer = BlockTyper(SPEC, "text", "f.jsonl")
    rows = typer.rows(Block(1, 0, deep + b"\n"))
    assert typer.line_blocks == 1
    assert [r.reason for r in rows.rejects] == ["json_invalid"]
    counts = KindCounts()
    count_kinds(Block(1, 0, deep + b"\n"), counts)
    assert counts.records == 0


def test_dropped_lines_keep_their_numbers() -> None:
    """A line over max_line between good lines is one dropped line; the blocks around it keep
    numbering the lines of the file."""
    data = b'{"text": "a"}\n' + b'{"text": "' + b"x" * 500 + b'"}\n' + b'{"text": "b"}\n'
    items = list(iter_blocks(io.BytesIO(data), "none", 100, None, 1 << 20, 64))
    kinds = [(type(i).__name__, i.number) for i in items]
    assert kinds == [("Block", 1), ("_Line", 2), ("Block", 3)]
    assert isinstance(items[1], _Line) and items[1].error.reason == "json_invalid"


def test_a_block_parsed_in_several_chunks_agrees_with_the_line_parser() -> None:
    """Blocks are parsed by Arrow in chunks of about PARSE_CHUNK on its threads: types seen only
    in a later chunk (a float after ints, text after timestamps and nulls, a key that appears
    late) and a line longer than a chunk give what one chunk gives, and the line parser's rows;
    kind counts resolve the same."""
    n = 30_000
    records = [
        {"text": f"document {i}", "n": i, "x": i, "tag": "2020-01-01T00:00:00" if i else None}
        for i in range(n)
    ]
    records[-3]["x"] = 2.5  # a float after a chunk of ints
    records[-2]["tag"] = "plain text"  # text after timestamps
    records[-1]["text"] = "y" * (PARSE_CHUNK + 10)  # a line longer than a chunk
    lines = [json.dumps(r).encode() for r in records]
    assert len(b"\n".join(lines)) > 3 * PARSE_CHUNK
    fast, slow = _both_paths(lines)
    assert fast is not None  # the Arrow path was taken
    _same(fast, slow)
    block = Block(1, 0, b"\n".join(lines) + b"\n")
    counts = KindCounts()
    count_kinds(block, counts)
    assert InferredSchema(counts.records, counts.fields).kinds() == {
        "text": "string",
        "n": "int",
        "x": "float",
        "tag": "string",
    }


def test_an_inferred_reading_is_typed_without_a_second_parse() -> None:
    """The fused scan types a block from the reading that counted its kinds: integers widen to a
    float column, an all-null key to its column's type; an integer a double cannot hold exactly
    sends the block back to a reading with the spec's schema."""
    records = [{"text": "a", "x": 1, "n": 2}, {"text": "b", "x": -3, "tag": None}]
    _, inferred, slow = _all_paths([json.dumps(r).encode() for r in records])
    assert inferred is not None
    _same(inferred, slow)
    assert inferred.table.column("x").to_pylist() == [1.0, -3.0]
    big = [{"text": "a", "x": 2**53 + 1}]
    explicit, inferred, slow = _all_paths([json.dumps(r).encode() for r in big])
    assert inferred is None and explicit is not None
    _same(explicit, slow)


_UTF8_EDGES = [
    b"\xed\xa0\x80",  # a surrogate
    b"\xed\x9f\xbf",  # the last code point before them
    b"\xc0\xaf",  # overlong
    b"\xe0\x80\xaf",
    b"\xf4\x90\x80\x80",  # past U+10FFFF
    b"\xf4\x8f\xbf\xbf",
    b"\xe2\x82",  # cut short
    b"\xff",
    b"\xef\xbb\xbf",
    b"\xf0\x9f\x98\x80",
]
# mostly valid text with a few stray bytes, so both answers are common
_TEXTISH = st.lists(
    st.one_of(
        st.text(max_size=6).map(str.encode), st.sampled_from(_UTF8_EDGES), st.binary(max_size=3)
    ),
    max_size=8,
).map(b"".join)


def _python_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


@settings(max_examples=400, deadline=None)
@given(_TEXTISH)
def test_the_block_checks_agree_with_pythons(data: bytes) -> None:
    """UTF-8 validity, a byte-order mark anywhere and the newline count, as the block reader
    computes them without the GIL, are Python's own answers."""
    assert _valid_utf8(data) is _python_utf8(data)
    assert _has_bom(data) is (b"\xef\xbb\xbf" in data)
    assert _newlines(data + b"\n\n") == data.count(b"\n") + 2


def test_the_utf8_check_refuses_what_pythons_decoder_refuses() -> None:
    for edge in _UTF8_EDGES:
        for data in (edge, b"abc" + edge, edge + b"xyz"):
            assert _valid_utf8(data) is _python_utf8(data), data
    assert _has_bom(b"") is False and _has_bom(b"\xef\xbb") is False and _has_bom(b"x\xef\xbb\xbf")
