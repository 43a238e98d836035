"""JSONL source: inference, validation and rejects, by-reference reads, compression and bounds.

Generated fixtures cover every reject kind; the real Dolma corpus (``$SHARDFEED_CORPORA/jsonl_dolma_cc``,
set by scripts/test.sh) checks plain vs gzip equality and nested JSON round trips.
"""

from __future__ import annotations

import gzip
import json
import os
import pickle
import random
import zlib
from functools import reduce
from pathlib import Path

import pytest
import zstandard
from hypothesis import given
from hypothesis import strategies as st

from shardfeed.formats.payload import table_row_bytes
from shardfeed.formats.sources.base import UnitRef
from shardfeed.formats.sources.jsonl import (
    KIND_ORDER,
    KINDS,
    InferredSchema,
    JsonlSource,
    _iter_lines,
    merge_inferred,
    resolve_kind,
)
from shardfeed.schemas.errors import ShardfeedError
from shardfeed.schemas.features import Feature, FeatureSpec

CORPORA = os.environ.get("SHARDFEED_CORPORA")
DOLMA = Path(CORPORA or "", "jsonl_dolma_cc")
CC_MAIN = "CC-MAIN-20190717121559-20190717143559-00140.jsonl"


def jl(obj: object) -> bytes:
    return json.dumps(obj, ensure_ascii=False).encode("utf-8")


def canon(value: object) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


# Main plain file: one line per case. (line bytes, expected reject (reason) or None for a good row)
MAIN_LINES: list[tuple[bytes, str | None]] = [
    (jl({"text": "hello", "n": 1, "x": 1.5, "flag": True, "meta": {"b": 2, "a": [1, "é"]}}), None),
    (b"", None),  # blank: skipped, not a reject
    (jl({"text": "world", "n": 2, "x": 2, "flag": False, "meta": [1, 2], "tag": None}), None),
    (jl({"n": 3}), "field_missing"),
    (jl({"text": 5}), "field_type"),
    (b'{"text": "broken"', "json_invalid"),
    (b'{"text": "caf\xe9"}', "utf8_invalid"),
    (b"[1, 2]", "json_invalid"),
    (jl({"text": "conflict", "n": "three"}), "field_type"),
    (jl({"text": "too big", "n": 2**63}), "field_type"),
    (jl({"text": None, "n": 4}), "field_missing"),
    (b"   \t\r", None),  # whitespace only: skipped
    (jl({"text": "ünï 漢字", "tag": "t", "n": -(2**63)}), None),
    (b'{"text": "nan", "x": NaN}', "json_invalid"),
    (b'{"text": "lone \\ud800"}', "utf8_invalid"),
    (jl({"text": "typed meta", "meta": "not nested"}), "field_type"),
    (b'{"text": "last, no newline", "x": 1e3}', None),
]


def write_main(path: Path) -> None:
    path.write_bytes(b"\n".join(line for line, _ in MAIN_LINES))


SUB_RECORDS = [
    {"text": "gz one", "n": 10, "x": 0.25, "flag": True},
    {"text": "gz two", "meta": {"k": [True, None]}, "tag": "g"},
]
ZST_RECORDS = [
    {"text": "zst one", "n": 20},
    {"text": "zst two", "x": -3, "flag": False},
]


def lines_of(records: list[dict]) -> bytes:
    return b"".join(jl(r) + b"\n" for r in records)


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    root = tmp_path / "corpus"
    (root / "sub").mkdir(parents=True)
    write_main(root / "a.jsonl")
    (root / "sub" / "b.jsonl.gz").write_bytes(gzip.compress(lines_of(SUB_RECORDS)))
    (root / "sub" / "c.jsonl.zst").write_bytes(
        zstandard.ZstdCompressor().compress(lines_of(ZST_RECORDS))
    )
    (root / "notes.txt").write_text("not an input")
    return root


def merged(source: JsonlSource) -> InferredSchema:
    return reduce(merge_inferred, (source.infer(f) for f in source.files()), InferredSchema())


def expected_row(record: dict) -> dict:
    """What the corpus fixture's spec makes of one good record."""
    meta = record.get("meta")
    x = record.get("x")
    return {
        "text": record["text"],
        "flag": record.get("flag"),
        "meta": None if meta is None else canon(meta),
        "n": record.get("n"),
        "tag": record.get("tag"),
        "x": None if x is None else float(x),
    }


def good_main_rows() -> list[tuple[int, dict]]:
    out = []
    for number, (line, reason) in enumerate(MAIN_LINES, start=1):
        if reason is None and line.strip():
            out.append((number, expected_row(json.loads(line))))
    return out


# --------------------------------------------------------------------------------------------------
# Inference and spec


def test_files_are_relative_sorted_and_filtered(corpus: Path) -> None:
    source = JsonlSource(str(corpus))
    assert source.kind == "jsonl"
    assert source.files() == ["a.jsonl", "sub/b.jsonl.gz", "sub/c.jsonl.zst"]
    single = JsonlSource(str(corpus / "sub" / "b.jsonl.gz"))
    assert single.files() == ["b.jsonl.gz"]
    assert Path(single.root) == (corpus / "sub").resolve()
    with pytest.raises(ShardfeedError, match="does not exist"):
        JsonlSource(str(corpus / "missing"))


def test_spec_columns_kinds_and_order(corpus: Path) -> None:
    source = JsonlSource(str(corpus))
    inferred = merged(source)
    assert inferred.kinds() == {
        "text": "string",  # 14 strings, one int vote; the text field is a string regardless
        "n": "int",
        "x": "float",  # int + float promote to float
        "flag": "bool",
        "meta": "json",  # nested objects and arrays outvote the one string
        "tag": "string",
    }
    spec = source.spec(inferred)
    assert spec.names == ["text", "flag", "meta", "n", "tag", "x"]
    assert [f.dtype for f in spec] == ["string", "bool", "string", "int64", "string", "float64"]
    assert all(f.shape == (1,) for f in spec)
    assert spec["meta"].extra == {"encoding": "json"}
    assert source.meta().fps == 0


def test_spec_requires_a_string_text_field(corpus: Path) -> None:
    source = JsonlSource(str(corpus), text_field="body")
    with pytest.raises(ShardfeedError, match=r"'body'.*keys found: flag, meta, n, tag, text, x"):
        source.spec(merged(source))
    with pytest.raises(ShardfeedError, match="no JSON records"):
        source.spec(InferredSchema())
    with pytest.raises(ShardfeedError, match="InferredSchema"):
        source.spec(None)
    only_ints = InferredSchema(2, {"text": {"int": 2}})
    with pytest.raises(ShardfeedError, match="holds no string"):
        JsonlSource(str(corpus)).spec(only_ints)


def test_resolve_kind_rules() -> None:
    assert resolve_kind({"int": 5, "float": 1}) == "float"
    assert resolve_kind({"int": 5}) == "int"
    assert resolve_kind({"int": 2, "float": 2, "string": 3}) == "float"  # numbers vote together
    assert resolve_kind({"string": 3, "bool": 4}) == "bool"
    assert resolve_kind({"null": 9, "bool": 1}) == "bool"  # nulls abstain
    assert resolve_kind({"null": 9}) == "string"
    assert resolve_kind({"json": 2, "string": 2}) == "string"  # tie: first of KIND_ORDER
    assert resolve_kind({"bool": 1, "json": 1}) == "bool"
    assert KIND_ORDER.index("bool") < KIND_ORDER.index("json")


counts = st.dictionaries(st.sampled_from([*KINDS, "null"]), st.integers(1, 50), max_size=4)
schemas = st.builds(
    InferredSchema,
    st.integers(0, 1000),
    st.dictionaries(st.sampled_from(["text", "a", "b", "c", "d"]), counts, max_size=5),
)


@given(schemas, schemas, schemas)
def test_merge_inferred_is_associative_and_commutative(a, b, c) -> None:
    assert merge_inferred(a, b) == merge_inferred(b, a)
    assert merge_inferred(merge_inferred(a, b), c) == merge_inferred(a, merge_inferred(b, c))
    assert merge_inferred(a, InferredSchema()) == a
    orders = [(a, b, c), (c, a, b), (b, c, a)]
    kinds = {tuple(sorted(reduce(merge_inferred, o).kinds().items())) for o in orders}
    assert len(kinds) == 1


class ChunkedStream:
    """A stream whose reads return at most the next of ``sizes`` bytes (short reads, any boundary)."""

    def __init__(self, data: bytes, sizes: list[int]) -> None:
        self.data, self.sizes, self.pos, self.i = data, sizes, 0, 0

    def read(self, n: int) -> bytes:
        size = min(n, self.sizes[self.i % len(self.sizes)])
        self.i += 1
        out = self.data[self.pos : self.pos + size]
        self.pos += len(out)
        return out


def reference_lines(data: bytes, max_line: int, limit: int | None) -> list[tuple]:
    bomb = limit is not None and len(data) > limit
    *complete, tail = (data[:limit] if bomb else data).split(b"\n")
    out, offset = [], 0
    for number, piece in enumerate(complete, start=1):
        out.append((number, offset, piece if len(piece) <= max_line else "too_long"))
        offset += len(piece) + 1
    if bomb:
        out.append((len(complete) + 1, offset, "bomb"))
    elif tail:
        out.append((len(complete) + 1, offset, tail if len(tail) <= max_line else "too_long"))
    return out


@given(
    st.binary(max_size=300).map(lambda b: bytes(b"ab \n"[x % 4] for x in b)),
    st.lists(st.integers(1, 40), min_size=1, max_size=5),
    st.integers(0, 30),
    st.data(),
)
def test_line_splitting_matches_a_plain_split(data, sizes, max_line, draw) -> None:
    limit = draw.draw(
        st.none() | st.integers(0, len(data) + 5) | st.sampled_from([len(data), len(data) - 1])
    )
    limit = None if limit is None else max(limit, 0)
    got = []
    for line in _iter_lines(ChunkedStream(data, sizes), "gzip", max_line, limit):
        if line.error is None:
            got.append((line.number, line.offset, line.data))
        else:
            kind = "bomb" if line.error.reason == "decompression_bomb" else "too_long"
            got.append((line.number, line.offset, kind))
    assert got == reference_lines(data, max_line, limit)


# --------------------------------------------------------------------------------------------------
# Scan: units and rejects


def test_scan_units_and_exact_rejects(corpus: Path) -> None:
    source = JsonlSource(str(corpus))
    spec = source.spec(merged(source))
    result = source.scan("a.jsonl", spec)
    expected = [
        ("a.jsonl", f"line:{i}", reason)
        for i, (_, reason) in enumerate(MAIN_LINES, start=1)
        if reason is not None
    ]
    assert [(r.source, r.position, r.reason) for r in result.rejects] == expected
    assert all(r.message for r in result.rejects)
    assert [u.position for u in result.units] == [n for n, _ in good_main_rows()]
    raw = (corpus / "a.jsonl").read_bytes()
    for unit in result.units:
        offset, length = unit.locator
        line = MAIN_LINES[unit.position - 1][0]
        assert raw[offset : offset + length] == line
        assert unit.rows == 1 and unit.file == "a.jsonl"
        assert len(unit.content_hash) == 32
        json.dumps(unit.locator)  # JSON-able
    messages = {r.position: r.message for r in result.rejects}
    assert messages["line:7"] == ("invalid UTF-8 at byte 13 of the line: invalid continuation byte")
    for compressed in ("sub/b.jsonl.gz", "sub/c.jsonl.zst"):
        other = source.scan(compressed, spec)
        assert other.rejects == [] and [u.position for u in other.units] == [1, 2]
    assert source.scan("a.jsonl", spec) == result  # deterministic


def test_reject_messages_are_clear(corpus: Path) -> None:
    source = JsonlSource(str(corpus))
    spec = source.spec(merged(source))
    by_line = {r.position: r.message for r in source.scan("a.jsonl", spec).rejects}
    assert "'text' is missing" in by_line["line:4"]
    assert "'text' is a number" in by_line["line:5"]
    assert "'n' is a string" in by_line["line:9"] and "int64" in by_line["line:9"]
    assert "does not fit int64" in by_line["line:10"]
    assert "'text' is null" in by_line["line:11"]
    assert "NaN" in by_line["line:14"]
    assert "surrogate" in by_line["line:15"]
    assert "array is not an object" in by_line["line:8"]


# --------------------------------------------------------------------------------------------------
# Read


def all_units(source: JsonlSource, spec: FeatureSpec) -> list:
    return [u for f in source.files() for u in source.scan(f, spec).units]


def expected_rows() -> dict[tuple[str, int], dict]:
    rows = {("a.jsonl", n): row for n, row in good_main_rows()}
    for i, record in enumerate(SUB_RECORDS, start=1):
        rows[("sub/b.jsonl.gz", i)] = expected_row(record)
    for i, record in enumerate(ZST_RECORDS, start=1):
        rows[("sub/c.jsonl.zst", i)] = expected_row(record)
    return rows


def test_read_round_trip_in_any_order(corpus: Path) -> None:
    source = JsonlSource(str(corpus))
    spec = source.spec(merged(source))
    units = all_units(source, spec)
    rows = expected_rows()
    assert len(units) == len(rows) == 8
    orders = [units, units[::-1], random.Random(7).sample(units, len(units))]
    orders.append([units[3], units[0], units[3]])  # repeats are allowed
    for order in orders:
        table = source.read(order, spec)
        assert table.schema == spec.arrow_schema()
        assert table.to_pylist() == [rows[(u.file, u.position)] for u in order]
        assert table_row_bytes(table).tolist() == [u.payload_bytes for u in order]
        assert source.read(order, spec).equals(table)
    empty = source.read([], spec)
    assert empty.num_rows == 0 and empty.schema == spec.arrow_schema()


def test_read_far_apart_lines_and_json_locators(tmp_path: Path) -> None:
    big = "b" * (3 << 20)  # 3 MiB: reads of the lines around it are not coalesced
    (tmp_path / "far.jsonl").write_bytes(
        lines_of([{"text": "first"}, {"text": big}, {"text": "last"}])
    )
    source = JsonlSource(str(tmp_path))
    spec = source.spec(source.infer("far.jsonl"))
    units = source.scan("far.jsonl", spec).units
    # refs that went through JSON (e.g. a Beam coder or a file) carry list locators
    thawed = [UnitRef(**{**json.loads(json.dumps(u.__dict__))}) for u in units]
    assert [tuple(u.locator) for u in thawed] == [u.locator for u in units]
    texts = source.read([thawed[2], thawed[0]], spec).column("text").to_pylist()
    assert texts == ["last", "first"]
    assert source.read(units, spec).column("text").to_pylist() == ["first", big, "last"]


def test_read_refuses_changed_lines(corpus: Path) -> None:
    source = JsonlSource(str(corpus))
    spec = source.spec(merged(source))
    units = source.scan("a.jsonl", spec).units
    data = bytearray((corpus / "a.jsonl").read_bytes())
    offset, _ = units[0].locator
    data[offset + 10] ^= 0x01
    (corpus / "a.jsonl").write_bytes(bytes(data))
    with pytest.raises(ShardfeedError, match="changed since it was scanned"):
        source.read(units[:1], spec)


def test_source_and_schema_pickle(corpus: Path) -> None:
    source = pickle.loads(pickle.dumps(JsonlSource(str(corpus))))
    inferred = pickle.loads(pickle.dumps(merged(source)))
    spec = source.spec(inferred)
    units = all_units(source, spec)
    assert source.read(units, spec).num_rows == 8


def test_user_spec_projects_and_checks_dtypes(corpus: Path) -> None:
    source = JsonlSource(str(corpus))
    spec = FeatureSpec((Feature("text", "string"), Feature("n", "int8")))
    result = source.scan("a.jsonl", spec)
    assert ("line:13", "field_type") in [(r.position, r.reason) for r in result.rejects]  # -2**63
    table = source.read(result.units, spec)
    assert table.column_names == ["text", "n"]
    with pytest.raises(ShardfeedError, match="cannot fill"):
        source.scan(
            "a.jsonl", FeatureSpec((Feature("text", "string"), Feature("v", "float32", (3,))))
        )
    with pytest.raises(ShardfeedError, match="no text field"):
        source.scan("a.jsonl", FeatureSpec((Feature("n", "int64"),)))


# --------------------------------------------------------------------------------------------------
# Compression, bounds, broken streams, paths


def test_compression_is_sniffed_not_named(tmp_path: Path) -> None:
    records = [{"text": f"doc {i}", "i": i} for i in range(5)]
    (tmp_path / "gzip_inside.jsonl").write_bytes(gzip.compress(lines_of(records)))
    (tmp_path / "plain_inside.jsonl.gz").write_bytes(lines_of(records))
    (tmp_path / "zstd_inside.jsonl.gz").write_bytes(
        zstandard.ZstdCompressor().compress(lines_of(records))
    )
    source = JsonlSource(str(tmp_path))
    spec = source.spec(merged(source))
    tables = []
    for file in source.files():
        result = source.scan(file, spec)
        assert result.rejects == []
        tables.append(source.read(result.units, spec))
    assert all(t.equals(tables[0]) for t in tables)
    assert tables[0].column("i").to_pylist() == list(range(5))
    assert [source.compression(f) for f in source.files()] == ["gzip", "none", "zstd"]


def zeros_gzip(megabytes: int) -> bytes:
    member = gzip.compress(b"\0" * (1 << 20), compresslevel=9)
    return member * megabytes  # a multi-member gzip stream


def zeros_zstd(megabytes: int) -> bytes:
    return zstandard.ZstdCompressor(level=19).compress(b"\0" * (1 << 20)) * megabytes


@pytest.mark.parametrize(
    ("name", "compress", "bomb"),
    [
        ("bomb.jsonl.gz", gzip.compress, zeros_gzip),
        ("bomb.jsonl.zst", zstandard.ZstdCompressor().compress, zeros_zstd),
    ],
)
def test_decompression_bomb_keeps_records_before_the_bound(
    tmp_path: Path, name, compress, bomb
) -> None:
    head = lines_of([{"text": "before 1"}, {"text": "before 2"}])
    (tmp_path / name).write_bytes(compress(head) + bomb(200))  # 200 MB of zeros, no newline
    source = JsonlSource(str(tmp_path), max_expanded_bytes=1 << 20)
    inferred = source.infer(name)
    assert inferred.records == 2
    spec = source.spec(inferred)
    result = source.scan(name, spec)
    assert [u.position for u in result.units] == [1, 2]
    assert [(r.source, r.position, r.reason) for r in result.rejects] == [
        (name, "line:3", "decompression_bomb")
    ]
    assert "max_expanded_bytes=1048576" in result.rejects[0].message
    assert source.read(result.units, spec).column("text").to_pylist() == ["before 1", "before 2"]


def test_plain_files_are_not_bounded_by_the_expansion_limit(tmp_path: Path) -> None:
    (tmp_path / "big.jsonl").write_bytes(lines_of([{"text": "x" * 1000}] * 50))
    source = JsonlSource(str(tmp_path), max_expanded_bytes=1000)
    result = source.scan("big.jsonl", source.spec(source.infer("big.jsonl")))
    assert len(result.units) == 50 and result.rejects == []


@pytest.mark.parametrize("compress", [None, gzip.compress, zstandard.ZstdCompressor().compress])
def test_overlong_lines_are_rejected_without_buffering(tmp_path: Path, compress) -> None:
    data = (
        jl({"text": "short"})
        + b"\n"
        + jl({"text": "y" * 5000})
        + b"\n"
        + jl({"text": "after"})
        + b"\n"
        + jl({"text": "z" * 300})  # last line, no newline
    )
    (tmp_path / "long.jsonl").write_bytes(compress(data) if compress else data)
    source = JsonlSource(str(tmp_path), max_line_bytes=100)
    spec = source.spec(source.infer("long.jsonl"))
    result = source.scan("long.jsonl", spec)
    assert [u.position for u in result.units] == [1, 3]
    assert [(r.position, r.reason) for r in result.rejects] == [
        ("line:2", "json_invalid"),
        ("line:4", "json_invalid"),
    ]
    assert "longer than max_line_bytes=100" in result.rejects[0].message
    assert source.read(result.units, spec).column("text").to_pylist() == ["short", "after"]


@pytest.mark.parametrize(
    ("name", "compress"),
    [("t.jsonl.gz", gzip.compress), ("t.jsonl.zst", zstandard.ZstdCompressor().compress)],
)
def test_truncated_streams_are_io_error_rejects(tmp_path: Path, name, compress) -> None:
    records = [{"text": f"record {i} " + "w" * (i % 97)} for i in range(30000)]
    full = compress(lines_of(records))
    (tmp_path / name).write_bytes(full[: len(full) - 7])
    source = JsonlSource(str(tmp_path))
    spec = source.spec(source.infer(name))
    result = source.scan(name, spec)
    assert len(result.rejects) == 1
    reject = result.rejects[0]
    assert reject.reason == "io_error" and "truncated" in reject.message
    kept = len(result.units)
    assert 0 < kept < len(records)
    assert [u.position for u in result.units] == list(range(1, kept + 1))
    assert reject.position == f"line:{kept + 1}"
    table = source.read(result.units[-3:], spec)
    assert table.column("text").to_pylist() == [r["text"] for r in records[kept - 3 : kept]]


def test_bom_and_crlf(tmp_path: Path) -> None:
    (tmp_path / "w.jsonl").write_bytes(b'\xef\xbb\xbf{"text": "bom"}\r\n{"text": "crlf"}\r\n')
    source = JsonlSource(str(tmp_path))
    spec = source.spec(source.infer("w.jsonl"))
    result = source.scan("w.jsonl", spec)
    assert result.rejects == []
    assert source.read(result.units, spec).column("text").to_pylist() == ["bom", "crlf"]


def test_symlinks_escaping_the_root_are_path_escape_rejects(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.jsonl").write_bytes(lines_of([{"text": "secret"}]))
    root = tmp_path / "root"
    (root / "sub").mkdir(parents=True)
    (root / "ok.jsonl").write_bytes(lines_of([{"text": "ok"}]))
    os.symlink(outside / "secret.jsonl", root / "link.jsonl")
    os.symlink(outside, root / "outdir")
    os.symlink(root, root / "sub" / "loop")  # a loop inside the root: not followed, not listed
    source = JsonlSource(str(root))
    assert source.files() == ["link.jsonl", "ok.jsonl", "outdir"]
    assert source.infer("link.jsonl") == InferredSchema()
    spec = source.spec(merged(source))
    for escaping in ("link.jsonl", "outdir"):
        result = source.scan(escaping, spec)
        assert result.units == []
        assert [(r.source, r.position, r.reason) for r in result.rejects] == [
            (escaping, "", "path_escape")
        ]
    assert len(source.scan("ok.jsonl", spec).units) == 1


def test_unparseable_gzip_header_is_io_error(tmp_path: Path) -> None:
    (tmp_path / "bad.jsonl.gz").write_bytes(b"\x1f\x8b" + zlib.compress(b"nonsense"))
    source = JsonlSource(str(tmp_path))
    result = source.scan("bad.jsonl.gz", FeatureSpec((Feature("text", "string"),)))
    assert [(r.position, r.reason) for r in result.rejects] == [("line:1", "io_error")]


# --------------------------------------------------------------------------------------------------
# The real Dolma corpus


requires_corpora = pytest.mark.skipif(
    not CORPORA, reason="SHARDFEED_CORPORA is not set (scripts/test.sh sets it)"
)


@pytest.fixture(scope="module")
def dolma():
    source = JsonlSource(str(DOLMA))
    spec = source.spec(merged(source))
    scans = {f: source.scan(f, spec) for f in source.files()}
    return source, spec, scans


def source_records(name: str) -> list[dict]:
    with open(DOLMA / name, "rb") as handle:
        return [json.loads(line) for line in handle if line.strip()]


@requires_corpora
def test_dolma_files_and_schema(dolma) -> None:
    source, spec, scans = dolma
    assert source.files() == [
        CC_MAIN,
        CC_MAIN + ".gz",
        "cc_en_head-0091.jsonl",
        "cc_en_head-0174.jsonl",
    ]
    assert spec.names[0] == "text"
    assert set(spec.names) == {
        "text", "id", "source", "created", "added", "version", "metadata", "attributes"
    }  # fmt: skip
    assert spec["metadata"].extra == spec["attributes"].extra == {"encoding": "json"}
    assert all(result.rejects == [] for result in scans.values())


@requires_corpora
def test_dolma_plain_and_gzip_give_identical_tables(dolma) -> None:
    source, spec, scans = dolma
    plain = source.read(scans[CC_MAIN].units, spec)
    packed = source.read(scans[CC_MAIN + ".gz"].units, spec)
    non_blank = sum(1 for line in (DOLMA / CC_MAIN).read_bytes().split(b"\n") if line.strip())
    assert non_blank == 697
    assert plain.num_rows == packed.num_rows == non_blank
    assert plain.equals(packed)
    hashes = [u.content_hash for u in scans[CC_MAIN].units]
    assert hashes == [u.content_hash for u in scans[CC_MAIN + ".gz"].units]
    assert len(set(hashes)) == 697


@requires_corpora
def test_dolma_values_round_trip(dolma) -> None:
    source, spec, scans = dolma
    for name in (CC_MAIN, "cc_en_head-0091.jsonl", "cc_en_head-0174.jsonl"):
        units = scans[name].units
        records = source_records(name)
        order = random.Random(1).sample(range(len(units)), len(units))
        table = source.read([units[i] for i in order], spec)
        rows = table.to_pylist()
        for i, row in zip(order, rows, strict=True):
            record = records[i]
            for key in ("text", "id", "source", "created", "added", "version"):
                assert row[key] == record.get(key)
            for key in ("metadata", "attributes"):
                if key in record:
                    assert json.loads(row[key]) == record[key]
                else:
                    assert row[key] is None
        assert table_row_bytes(table).tolist() == [units[i].payload_bytes for i in order]
    assert (
        len(scans["cc_en_head-0091.jsonl"].units) == len(scans["cc_en_head-0174.jsonl"].units) == 10
    )


# --------------------------------------------------------------------------------------------------
# Schema drift across files (the rule TFRecord and Parquet follow too)


def _drifting(root: Path, strays: int = 0) -> Path:
    """``a.jsonl`` holds ``x`` as numbers (ints and floats), ``b.jsonl`` as text; with ``strays``
    the text is only that many records of ``b.jsonl``, the rest numbers."""
    root.mkdir()
    a = [{"text": f"a{i}", "x": i if i % 2 else i + 0.5} for i in range(60)]
    b = [{"text": f"b{i}", "x": f"t{i}" if strays == 0 or i < strays else i} for i in range(60)]
    (root / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in a))
    (root / "b.jsonl").write_text("".join(json.dumps(r) + "\n" for r in b))
    return root


def test_a_key_whose_kind_differs_across_files_stops_with_its_name(tmp_path, capsys) -> None:
    from shardfeed.cli.main import main

    src = _drifting(tmp_path / "src")
    assert main(["convert", str(src), str(tmp_path / "refused")]) != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert "feature 'x' differs across files" in err
    assert "number in 60 records (e.g. a.jsonl)" in err
    assert "string in 60 records (e.g. b.jsonl)" in err and "--unify-schemas" in err
    assert not (tmp_path / "refused" / "meta").exists()


def test_unify_schemas_keeps_a_drifting_key_as_json_text(tmp_path) -> None:
    from shardfeed.cli.main import main
    from shardfeed.formats.reader import open_dataset

    src = _drifting(tmp_path / "src")
    dst = tmp_path / "ds"
    assert main(["convert", str(src), str(dst), "--unify-schemas", "--no-shuffle"]) == 0
    ds = open_dataset(dst)
    assert ds.features["x"].dtype == "string" and ds.features["x"].extra["unified"] == "any"
    values = ds.read(0, len(ds), columns=["x"])["x"]
    assert list(values[:3]) == ["0.5", "1", "2.5"] and list(values[60:62]) == ['"t0"', '"t1"']
    assert ds.manifest.rejects.total == 0 and len(ds) == 120
    assert main(["verify", str(dst)]) == 0


def test_stray_values_of_another_kind_stay_rejects(tmp_path) -> None:
    from shardfeed.cli.main import main
    from shardfeed.formats.reader import open_dataset

    src = _drifting(tmp_path / "src", strays=3)  # 3 of 120: at most DRIFT_SHARE
    dst = tmp_path / "ds"
    assert main(["convert", str(src), str(dst), "--max-reject-fraction", "0.1"]) == 0
    ds = open_dataset(dst)
    assert ds.features["x"].dtype == "float64"
    assert len(ds) == 117 and dict(ds.manifest.rejects.by_reason) == {"field_type": 3}


def test_drift_examples_merge_like_the_counts() -> None:
    a = InferredSchema(1, {"x": {"int": 1}}, {"x": {"int": ["c.jsonl"]}})
    b = InferredSchema(2, {"x": {"int": 2}}, {"x": {"int": ["a.jsonl", "b.jsonl"]}})
    assert merge_inferred(a, b).files == {"x": {"int": ["a.jsonl", "b.jsonl"]}}
    assert merge_inferred(a, b) == merge_inferred(b, a)


def test_kinds_mixed_within_each_file_are_not_drift(tmp_path) -> None:
    """Drift is files disagreeing; a key that is messy inside every file keeps its majority
    kind, and the other values are rejects."""
    root = tmp_path / "src"
    root.mkdir()
    for name in ("a.jsonl", "b.jsonl"):
        rows = [{"text": "t", "x": i if i % 3 else f"s{i}"} for i in range(30)]
        (root / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    source = JsonlSource(str(root))
    inferred = merged(source)
    assert inferred.majors == {"text": {"string": 2}, "x": {"number": 2}}
    assert inferred.drift("x") is None and source.spec(inferred)["x"].dtype == "int64"
