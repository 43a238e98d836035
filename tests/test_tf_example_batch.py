"""The batch decoder of tf.train.Example (``formats/tf_example_batch.py``) and the columnar typing
of ``formats/sources/tfrecord_columns.py``, checked record by record against the record decoder
and ``tfrecord_source._Converter``, which stay the reference for every rule of the format."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_convert_pipeline import CORPORA, needs_corpora
from test_tfrecord_codec import (
    FUZZ_EXAMPLES,
    MALFORMED,
    ROUND_TRIPS,
    edits,
    entry,
    example,
    examples,
    f32,
    field,
    mutate,
    varint,
)

from shardfeed.formats.sources.tfrecord_source import (
    TFRecordSource,
    _Converter,
    _rows_table,
    merge_inferred,
)
from shardfeed.formats.tf_example import ExampleDecodeError, decode_example, encode_example
from shardfeed.formats.tf_example_batch import KIND_NAMES, MAX_FIELDS, decode_batch
from shardfeed.formats.tfrecord import write_records
from shardfeed.schemas.rejects import RejectError, RejectRecord


def per_record(batch, i: int) -> dict:
    """Record ``i`` of a decoded batch as ``decode_example`` gives it, less Features with no
    kind (which every reader treats as missing)."""
    out = {}
    for name, kv in sorted(batch.keys.items()):
        code = int(kv.kind[i])
        if code == 0:
            continue
        n = int(kv.counts[i])
        before = int(kv.counts[:i][kv.kind[:i] == code].sum())
        kind = KIND_NAMES[code]
        if kind == "bytes":
            values = kv.blobs.slice(before, n).to_pylist()
        else:
            values = (kv.floats if kind == "float" else kv.ints)[before : before + n]
        out[name] = (kind, values)
    return out


def same(got: dict, want: dict) -> None:
    want = {key: value for key, value in want.items() if value[0] is not None}
    assert sorted(got) == sorted(want)
    for key, (kind, values) in want.items():
        got_kind, got_values = got[key]
        assert got_kind == kind, key
        if kind == "bytes":
            assert list(got_values) == list(values), key
        elif kind is not None:
            assert np.array_equal(np.asarray(got_values), np.asarray(values), equal_nan=True), key


def check_batch(records: list[bytes]) -> np.ndarray:
    """Decode ``records`` as a batch; every regular record must equal the record decoder's
    result, every irregular one must be one the record decoder is needed for. Returns the
    irregular flags."""
    batch = decode_batch(records)
    assert batch.size == len(records)
    for i, data in enumerate(records):
        if batch.irregular[i]:
            continue
        same(per_record(batch, i), dict(sorted(decode_example(data).items())))
    return batch.irregular


@pytest.mark.parametrize("features", ROUND_TRIPS.values(), ids=ROUND_TRIPS.keys())
def test_round_trip_examples_decode_as_columns(features):
    records = [encode_example(features)] * 3 + [encode_example({"other": ("int64", [5])})]
    assert not check_batch(records).any()


@FUZZ_EXAMPLES
@given(st.lists(examples, min_size=1, max_size=12))
def test_any_encoded_examples_decode_as_columns(batch):
    records = [encode_example(features) for features in batch]
    assert not check_batch(records).any()  # what writers write is never left over


HAND_BUILT = {
    "unpacked floats": example(entry("f", field(2, 2, b"\x0d" + f32(1.5) + b"\x0d" + f32(2)))),
    "unpacked ints": example(entry("i", field(3, 2, b"\x08\x01\x08\x02"))),
    "unknown field in Example": example(entry("i", field(3, 2, field(1, 2, b"\x01"))))
    + field(2, 0, b"\x07"),
    "two features fields": example(entry("a", field(3, 2, field(1, 2, b"\x01"))))
    + example(entry("b", field(3, 2, field(1, 2, b"\x02")))),
    "value before key": field(
        1, 2, field(1, 2, field(2, 2, field(3, 2, field(1, 2, b"\x01"))) + field(1, 2, b"k"))
    ),
    "repeated key": example(
        entry("k", field(3, 2, field(1, 2, b"\x01"))), entry("k", field(1, 2, field(1, 2, b"x")))
    ),
    "two kinds in a Feature": example(
        entry("k", field(3, 2, field(1, 2, b"\x01")) + field(2, 2, field(1, 2, f32(1))))
    ),
    "a group": example(entry("k", field(3, 2, field(1, 2, b"\x01")))) + b"\x0b\x0c",
    "entry without a value": example(field(1, 2, b"k")),
    "bad utf-8 key": example(field(1, 2, b"\xff\xfe") + field(2, 2, field(3, 2, b""))),
    "long list": example(entry("b", field(1, 2, field(1, 2, b"x") * (MAX_FIELDS + 1)))),
}


@pytest.mark.parametrize("data", HAND_BUILT.values(), ids=HAND_BUILT.keys())
def test_records_the_batch_leaves_to_the_record_decoder(data):
    good = encode_example({"k": ("int64", [1, 2]), "s": ("bytes", [b"a"])})
    irregular = check_batch([good, data, good])
    assert irregular.tolist() == [False, True, False]


@pytest.mark.parametrize(("data", "problem"), MALFORMED.values(), ids=MALFORMED.keys())
def test_malformed_records_are_irregular(data, problem):
    good = encode_example({"k": ("float", [1.0])})
    assert check_batch([good, data, good]).tolist() == [False, True, False]


@FUZZ_EXAMPLES
@given(examples, edits)
def test_mutated_records_never_decode_wrongly(features, changes):
    """A damaged record is either decoded exactly as the record decoder does, or irregular."""
    data = mutate(encode_example(features), changes)
    batch = decode_batch([data])
    if not batch.irregular[0]:
        same(per_record(batch, 0), dict(sorted(decode_example(data).items())))


def test_varints_of_every_length():
    values = [0, 1, 127, 128, 2**14, 2**21 - 1, 2**35, 2**56, 2**63 - 1, -1, -(2**63)]
    records = [encode_example({"i": ("int64", values[:n])}) for n in range(1, len(values) + 1)]
    records.append(example(entry("i", field(3, 2, field(1, 2, varint(2**64 - 1) * 3)))))
    assert not check_batch(records).any()


# --------------------------------------------------------------------------------------------------
# The source: columns typed to the spec equal the per-record converter's


def reference_scan(source: TFRecordSource, file: str, spec) -> tuple:
    """What the per-record path gives: positions, payload sizes, table, rejects."""
    convert = _Converter(spec)
    rows, positions, sizes, rejects = [], [], [], []
    for position, (_, _, found) in enumerate(source._examples(file, rejects)):
        if found is None:
            continue
        try:
            values, size = convert(found)
        except RejectError as err:
            rejects.append(RejectRecord.from_error(file, f"record:{position}", err))
            continue
        rows.append(values)
        positions.append(position)
        sizes.append(size)
    return positions, sizes, _rows_table(rows, spec), rejects


def assert_scan_matches_reference(source: TFRecordSource) -> int:
    merged = None
    for file in source.files():
        part = source.infer(file)
        merged = part if merged is None else merge_inferred(merged, part)
    spec = source.spec(merged)
    scanned = 0
    for file in source.files():
        parts = list(source.scan_rows(file, spec))
        positions, sizes, table, rejects = reference_scan(source, file, spec)
        assert np.concatenate([p.positions for p in parts]).tolist() == positions
        assert np.concatenate([p.payload for p in parts]).tolist() == sizes
        assert pa.concat_tables([p.table for p in parts]).equals(table)
        key = lambda r: (r.position, r.reason, r.message)  # noqa: E731
        got = sorted((r for p in parts for r in p.rejects), key=key)
        assert got == sorted(rejects, key=key)
        scanned += len(positions)
    return scanned


@pytest.mark.parametrize(("drift", "unify"), [(False, False), (False, True), (True, True)])
def test_mixed_file_scans_as_the_record_path_does(tmp_path: Path, drift, unify):
    """Regular and irregular records and every reject the converter gives; ``n`` holds a few
    stray floats (rejects), or floats in the second file, which ``--unify-schemas`` promotes."""
    rng = np.random.default_rng(3)
    records = []
    for i in range(600):
        features = {
            "id": ("int64", [i]),
            "x": ("float", rng.random(4).astype(np.float32)),
            "text": ("bytes", [f"doc {i} é".encode()]),
            "tags": ("bytes", [b"a", b"b"][: i % 3]),
            "img": ("bytes", [b"\x89PNG\r\n\x1a\n" + bytes(i % 7)]),
            "n": ("float", [i + 0.5]) if (i >= 400 if drift else i % 50 == 1) else ("int64", [i]),
        }
        if i % 50 == 7:
            features["x"] = ("float", [1.0])  # wrong length: field_type
        if i % 50 == 11:
            features["text"] = ("bytes", [b"\xff\xfe bad"])  # utf8_invalid
        if i % 50 == 13:
            features["id"] = ("bytes", [b"not a number"])  # kind conflict
        if i % 50 == 17:
            features["n"] = ("int64", [2**60])  # beyond float64's exact integers
        if i % 50 == 37:  # text JSON escapes
            features["tags"] = ("bytes", [b'say "hi"\n', b"raw \\", "\u00e9".encode()])
        if i % 50 == 41:  # bytes that are not UTF-8
            features["tags"] = ("bytes", [b"\xff", b"ok"])
        if i % 50 == 19:
            features.pop("text")  # missing: null
        data = encode_example(features)
        if i % 50 == 23:
            data = data + field(9, 0, b"\x01")  # an unknown field: irregular, same values
        if i % 50 == 29:
            data = b"\x0a\x05abc"  # not an Example: example_invalid
        records.append(data)
    root = tmp_path / "tf"
    root.mkdir()
    write_records(root / "a.tfrecord", records[:400])
    write_records(root / "b.tfrecord.gz", records[400:], compression="gzip")
    source = TFRecordSource(str(root), unify_schemas=unify)
    assert assert_scan_matches_reference(source) > 500


@needs_corpora
def test_chicago_taxi_corpus_scans_as_the_record_path_does():
    root = Path(CORPORA) / "tfrecord_chicago_taxi"
    source = TFRecordSource(str(root), unify_schemas=True)
    assert assert_scan_matches_reference(source) == 30_000
    for part in sorted(p for p in root.iterdir() if p.is_dir()):
        assert assert_scan_matches_reference(TFRecordSource(str(part))) > 0


def test_decode_errors_still_name_the_problem(tmp_path: Path):
    write_records(tmp_path / "x.tfrecord", [b"\x0a\x05abc"])
    source = TFRecordSource(str(tmp_path / "x.tfrecord"))
    with pytest.raises(ExampleDecodeError):
        decode_example(b"\x0a\x05abc")
    rejects = []
    assert [e for _, _, e in source._examples(source.files()[0], rejects)] == [None]
    assert rejects[0].reason == "example_invalid" and "runs past the end" in rejects[0].message


def test_gather_is_the_slices_joined_whatever_their_sizes_and_order():
    """Small ranges go through a byte index a chunk at a time, large ones are copied as slices
    (so an image batch never builds an index of 8 bytes per byte); the result is the slices."""
    from shardfeed.formats.tf_example_batch import gather

    rng = np.random.default_rng(0)
    buf = rng.integers(0, 256, 3_000_000, dtype=np.uint8)
    for _ in range(50):
        n = int(rng.integers(0, 400))
        sizes = rng.choice([0, 1, 7, 300, 5_000, 50_000, 1_500_000], n)
        starts = rng.integers(0, len(buf) - 1_500_001, n)  # any order, overlaps allowed
        got = gather(buf, starts, starts + sizes)
        assert got.to_pylist() == [
            buf[a : a + s].tobytes() for a, s in zip(starts, sizes, strict=True)
        ]
