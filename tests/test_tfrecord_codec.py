"""TFRecord framing and the tf.train.Example codec: round trips, golden bytes, corruption, fuzzing,
and cross-checks against the real ``protobuf`` package and Apache Beam's TFRecord code when present."""

from __future__ import annotations

import contextlib
import gzip
import io
import os
import pickle
import random
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardfeed.formats import tfrecord
from shardfeed.formats.tf_example import (
    ExampleDecodeError,
    ExampleEncodeError,
    decode_example,
    encode_example,
)
from shardfeed.formats.tfrecord import (
    TFRecordError,
    TFRecordWriter,
    iter_records,
    masked_crc32c,
    read_record_at,
    write_records,
)
from shardfeed.schemas.errors import ShardfeedError

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
#: for strategies that build whole feature dicts (slower to draw)
FUZZ_EXAMPLES = settings(FUZZ, max_examples=150)


def sample_records(n: int = 20, seed: int = 0) -> list[bytes]:
    """Records of assorted sizes, including empty ones and one bigger than a few reads."""
    rng = random.Random(seed)
    sizes = [0, 1, 7, 12, 100, 35615, 5000] + [rng.randrange(0, 3000) for _ in range(n - 7)]
    return [rng.randbytes(size) for size in sizes]


def expected_offsets(records: list[bytes]) -> list[int]:
    offsets, at = [], 0
    for record in records:
        offsets.append(at)
        at += 16 + len(record)
    return offsets


def read_all(source, **kwargs) -> list[tuple[int, bytes]]:
    return list(iter_records(source, **kwargs))


def read_tolerant(source, **kwargs) -> tuple[list[tuple[int, bytes]], list[TFRecordError]]:
    errors: list[TFRecordError] = []
    records = list(iter_records(source, on_error=errors.append, **kwargs))
    return records, errors


# ---------------------------------------------------------------------------------------------------
# CRC and framing golden bytes


def crc32c_bitwise(data: bytes) -> int:
    """Castagnoli CRC, bit by bit (reflected polynomial 0x82F63B78): independent of the crc32c package."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def masked_bitwise(data: bytes) -> int:
    crc = crc32c_bitwise(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) % (1 << 32)


def test_crc32c_check_value_and_mask():
    assert crc32c_bitwise(b"123456789") == 0xE3069283  # the CRC-32C check value
    for data in (b"", b"a", b"123456789", bytes(range(256)) * 3):
        assert masked_crc32c(data) == masked_bitwise(data)
        assert masked_crc32c(bytearray(data)) == masked_bitwise(data)
        assert masked_crc32c(memoryview(data)) == masked_bitwise(data)


def test_framing_golden_bytes():
    records = [b"hello", b""]
    out = io.BytesIO()
    assert write_records(out, records) == [0, 21]
    golden = b""
    for record in records:
        length = struct.pack("<Q", len(record))
        golden += length + struct.pack("<I", masked_bitwise(length))
        golden += record + struct.pack("<I", masked_bitwise(record))
    assert out.getvalue() == golden


# ---------------------------------------------------------------------------------------------------
# Framing round trips


@pytest.mark.parametrize("compression", [None, "gzip"])
def test_round_trip_path(tmp_path: Path, compression):
    records = sample_records()
    path = tmp_path / "a.tfrecord"
    offsets = write_records(path, records, compression=compression)
    assert offsets == expected_offsets(records)
    assert read_all(path) == list(zip(offsets, records, strict=True))
    assert read_all(str(path), compression=compression) == list(zip(offsets, records, strict=True))
    with open(path, "rb") as handle:
        assert read_all(handle) == list(zip(offsets, records, strict=True))
    assert path.read_bytes()[:2] == (b"\x1f\x8b" if compression else struct.pack("<H", 0))


@pytest.mark.parametrize("chunk", [1, 5, 13, 4096])
@pytest.mark.parametrize("compression", [None, "gzip"])
def test_round_trip_across_read_boundaries(monkeypatch, chunk, compression):
    """Every record straddles reads somewhere when the read size is tiny."""
    monkeypatch.setattr(tfrecord, "READ_CHUNK", chunk)
    records = sample_records(12, seed=chunk)
    out = io.BytesIO()
    offsets = write_records(out, records, compression=compression)
    out.seek(0)
    assert read_all(out) == list(zip(offsets, records, strict=True))


def test_writer_class_offsets_and_buffer_types(tmp_path: Path):
    path = tmp_path / "w.tfrecord"
    big = os.urandom(tfrecord.WRITE_BUFFER + 3)  # written straight through, not buffered
    items = [b"a", bytearray(b"bc"), memoryview(b"xdefx")[1:4], big, np.arange(4, dtype=np.uint8)]
    with TFRecordWriter(path) as writer:
        offsets = [writer.write(item) for item in items]
        assert writer.bytes_written == sum(16 + len(bytes(i)) for i in items)
    assert offsets == expected_offsets([bytes(i) for i in items])
    assert [data for _, data in read_all(path)] == [bytes(i) for i in items]
    with pytest.raises(ValueError, match="closed"):
        writer.write(b"late")


def test_writer_leaves_a_caller_file_open():
    out = io.BytesIO()
    with TFRecordWriter(out, compression="gzip") as writer:
        writer.write(b"x")
    assert not out.closed
    assert gzip.decompress(out.getvalue())[12:13] == b"x"


def test_empty_files(tmp_path: Path):
    assert write_records(tmp_path / "e", []) == []
    assert (tmp_path / "e").read_bytes() == b""
    assert read_all(tmp_path / "e") == []
    write_records(tmp_path / "g", [], compression="gzip")
    assert gzip.decompress((tmp_path / "g").read_bytes()) == b""
    assert read_all(tmp_path / "g") == []


def test_random_access(tmp_path: Path):
    records = sample_records()
    path = tmp_path / "r.tfrecord"
    offsets = write_records(path, records)
    with open(path, "rb") as handle:
        for offset, record in reversed(list(zip(offsets, records, strict=True))):
            assert read_record_at(handle, offset) == record
    assert read_record_at(path, offsets[5]) == records[5]
    with pytest.raises(TFRecordError) as info:
        read_record_at(path, offsets[5] + 1)  # not a record start
    assert info.value.reason == "length crc"
    with pytest.raises(TFRecordError) as info:
        read_record_at(path, path.stat().st_size - 3)
    assert info.value.reason == "truncated"


def test_gzip_output_is_deterministic(tmp_path: Path):
    records = sample_records()
    a, b = tmp_path / "one.tfrecord.gz", tmp_path / "other-name.gz"
    write_records(a, records, compression="gzip")
    with open(b, "wb") as handle:  # a named file object: its name must not reach the header
        write_records(handle, records, compression="gzip")
    assert a.read_bytes() == b.read_bytes()
    header = a.read_bytes()[:10]
    assert header[3] == 0  # no FNAME, FEXTRA, FCOMMENT flags
    assert header[4:8] == b"\x00\x00\x00\x00"  # mtime 0
    assert gzip.decompress(a.read_bytes()) == b"".join(_frame(r) for r in records)


def _frame(record: bytes) -> bytes:
    length = struct.pack("<Q", len(record))
    return (
        length
        + struct.pack("<I", masked_crc32c(length))
        + record
        + struct.pack("<I", masked_crc32c(record))
    )


def test_multi_member_gzip_reads_as_one_stream():
    records = sample_records(6)
    blob = gzip.compress(b"".join(_frame(r) for r in records[:3]), mtime=0)
    blob += gzip.compress(b"".join(_frame(r) for r in records[3:]), mtime=0)
    assert [r for _, r in read_all(io.BytesIO(blob))] == records


def test_plain_file_that_starts_with_the_gzip_magic():
    """A first record of 35615 bytes has length bytes 1f 8b: sniffing must not call it gzip."""
    records = [b"z" * 0x8B1F, b"next"]
    out = io.BytesIO()
    write_records(out, records)
    assert out.getvalue()[:2] == b"\x1f\x8b"
    out.seek(0)
    assert [r for _, r in read_all(out)] == records


# ---------------------------------------------------------------------------------------------------
# Corruption


def _plain(records: list[bytes]) -> bytes:
    out = io.BytesIO()
    write_records(out, records)
    return out.getvalue()


def test_every_single_byte_flip_is_caught_at_the_right_record(tmp_path: Path):
    records = [b"", b"abc", os.urandom(40), b"\x00" * 9]
    blob = _plain(records)
    offsets = expected_offsets(records)
    path = tmp_path / "f.tfrecord"
    for at in range(len(blob)):
        damaged = bytearray(blob)
        damaged[at] ^= 0x01
        path.write_bytes(damaged)
        k = max(i for i, o in enumerate(offsets) if o <= at)
        in_header = at - offsets[k] < 12
        # strict: the earlier records come out, then the error names the damaged record
        got = []
        with pytest.raises(TFRecordError) as info:
            for item in iter_records(path):
                got.append(item)
        err = info.value
        assert got == list(zip(offsets, records, strict=True))[:k]
        assert err.offset == offsets[k]
        assert err.reason == ("length crc" if in_header else "data crc")
        assert str(path) in str(err) and f"offset {offsets[k]}" in str(err)
        # tolerant: a data crc drops only its record, a length crc ends the file
        good, errors = read_tolerant(path)
        assert [(e.offset, e.reason) for e in errors] == [(offsets[k], err.reason)]
        expect = list(zip(offsets, records, strict=True))
        assert good == (expect[:k] if in_header else expect[:k] + expect[k + 1 :])


def test_every_truncation_keeps_the_whole_records_before_it():
    records = [b"abc", b"", os.urandom(30), b"tail"]
    blob = _plain(records)
    offsets = expected_offsets(records)
    for cut in range(len(blob)):
        good, errors = read_tolerant(io.BytesIO(blob[:cut]))
        whole = [(o, r) for o, r in zip(offsets, records, strict=True) if o + 16 + len(r) <= cut]
        assert good == whole
        if cut in offsets:
            assert errors == []
        else:
            assert [(e.offset, e.reason) for e in errors] == [(offsets[len(whole)], "truncated")]


@pytest.mark.parametrize("cut", [1, 8, 9, 30, 200, 5000])
def test_truncated_gzip(cut):
    records = [os.urandom(2000) for _ in range(6)]  # random data: the gzip stream is ~12 KB
    out = io.BytesIO()
    offsets = write_records(out, records, compression="gzip")
    blob = out.getvalue()[:-cut]
    available = len(zlib.decompressobj(31).decompress(blob))  # what any reader can recover
    whole = [(o, r) for o, r in zip(offsets, records, strict=True) if o + 16 + len(r) <= available]
    good, errors = read_tolerant(io.BytesIO(blob))
    assert good == whole and len(whole) >= (6 if cut <= 8 else 1 if cut < 5000 else 0)
    assert [e.reason for e in errors] == ["truncated"]
    assert errors[0].offset == (offsets[len(good)] if len(good) < len(records) else 16 * 6 + 12000)
    with pytest.raises(TFRecordError, match="truncated"):
        read_all(io.BytesIO(blob))


@pytest.mark.parametrize("chunk", [7, 4 << 20])
@pytest.mark.parametrize("at", [100, 3000, -6, -2])
def test_corrupt_gzip_keeps_what_inflates_before_the_damage(monkeypatch, chunk, at):
    monkeypatch.setattr(tfrecord, "READ_CHUNK", chunk)
    rng = random.Random(at)
    # half random, half repetitive: both stored and Huffman-coded deflate blocks
    records = [rng.randbytes(500) + bytes([i]) * 500 for i in range(8)]
    out = io.BytesIO()
    offsets = write_records(out, records, compression="gzip")
    blob = bytearray(out.getvalue())
    blob[at] ^= 0x55
    z = zlib.decompressobj(31)
    available = b""
    for i in range(len(blob)):  # inflate byte by byte up to the first error
        try:
            available += z.decompress(bytes(blob[i : i + 1]))
        except zlib.error:
            break
    plain = b"".join(_frame(r) for r in records)
    intact = next(
        (i for i, (a, b) in enumerate(zip(available, plain, strict=False)) if a != b),
        min(len(available), len(plain)),
    )
    originals = list(zip(offsets, records, strict=True))
    good, errors = read_tolerant(io.BytesIO(bytes(blob)))
    assert good[: sum(o + 16 + len(r) <= intact for o, r in originals)] == [
        (o, r) for o, r in originals if o + 16 + len(r) <= intact
    ]
    assert all(item in originals for item in good)
    assert errors and errors[-1].reason in ("gzip", "data crc", "length crc", "truncated")
    if at < 0:  # the trailer: every record comes out, then the gzip error
        assert good == list(zip(offsets, records, strict=True))
        assert errors[0].reason == "gzip"


def test_gzip_data_that_is_not_gzip():
    with pytest.raises(TFRecordError) as info:
        read_all(io.BytesIO(b"\x1f\x8b\x08\x00" + b"\xff" * 40))
    assert info.value.reason == "gzip"
    with pytest.raises(TFRecordError) as info:
        read_all(io.BytesIO(_plain([b"abc"])), compression="gzip")
    assert info.value.reason == "gzip"


def test_max_record_bytes_skips_big_records():
    records = [b"a", b"x" * 5000, b"b", b"y" * 300]
    blob = _plain(records)
    offsets = expected_offsets(records)
    good, errors = read_tolerant(io.BytesIO(blob), max_record_bytes=1000)
    assert good == [(offsets[0], b"a"), (offsets[2], b"b"), (offsets[3], b"y" * 300)]
    assert [(e.offset, e.reason, e.resumable) for e in errors] == [(offsets[1], "too large", True)]
    with pytest.raises(TFRecordError, match="too large"):
        read_all(io.BytesIO(blob), max_record_bytes=1000)
    # a huge, CRC-valid length in a short file: skipped to the end, reported as truncated
    length = struct.pack("<Q", 1 << 60)
    bomb = length + struct.pack("<I", masked_crc32c(length)) + b"q" * 50
    good, errors = read_tolerant(io.BytesIO(blob + bomb), max_record_bytes=1000)
    assert [e.reason for e in errors] == ["too large", "truncated"]
    assert errors[1].offset == len(blob)


def test_error_is_a_picklable_shardfeed_error():
    err = TFRecordError("s3://b/x.tfrecord", 4096, "data crc", "detail")
    assert isinstance(err, ShardfeedError)
    back = pickle.loads(pickle.dumps(err))
    assert (back.source, back.offset, back.reason, str(back)) == (
        err.source,
        err.offset,
        err.reason,
        str(err),
    )
    assert err.reject_reason == "tfrecord_data_crc" and err.resumable
    assert not TFRecordError("x", 0, "length crc").resumable


@FUZZ
@given(st.binary(max_size=300))
def test_fuzz_reader_random_bytes(blob):
    for compression in ("auto", None, "gzip"):
        try:
            for _ in iter_records(io.BytesIO(blob), compression=compression):
                pass
        except TFRecordError:
            pass
        read_tolerant(io.BytesIO(blob), compression=compression)  # never raises


_FUZZ_RECORDS = [*sample_records(5, seed=3)[:2], b"abc", b"", b"z" * 40]
_FUZZ_PLAIN = _plain(_FUZZ_RECORDS)
_FUZZ_GZIP = zlib.compress(_FUZZ_PLAIN, 6, 31)


@FUZZ
@given(
    st.sampled_from([_FUZZ_PLAIN, _FUZZ_GZIP]),
    st.lists(
        st.tuples(st.integers(0, 10**6), st.integers(0, 255), st.sampled_from("sdi")), max_size=4
    ),
    st.integers(0, 10**6),
)
def test_fuzz_reader_mutated_files(blob, edits, cut):
    data = bytearray(blob)
    for at, value, op in edits:
        at %= len(data) + 1
        if op == "s" and at < len(data):
            data[at] = value
        elif op == "d":
            del data[at : at + 1 + value % 8]
        else:
            data[at:at] = bytes([value])
    data = bytes(data[: len(data) - cut % 20])
    with contextlib.suppress(TFRecordError):
        read_all(io.BytesIO(data))
    good, _ = read_tolerant(io.BytesIO(data))
    for _, record in good:  # whatever passes both CRCs is a record that was written
        assert record in _FUZZ_RECORDS


def test_beam_reads_ours_and_writes_the_same_bytes():
    tfrecordio = pytest.importorskip("apache_beam.io.tfrecordio")
    records = sample_records(8)
    ours = _plain(records)
    theirs = io.BytesIO()
    for record in records:
        tfrecordio._TFRecordUtil.write_record(theirs, record)
    assert theirs.getvalue() == ours
    stream = io.BytesIO(ours)
    assert [tfrecordio._TFRecordUtil.read_record(stream) for _ in records] == records


# ---------------------------------------------------------------------------------------------------
# tf.train.Example: golden bytes and round trips

# Example{features{feature{"id": int64_list[-1, 150]}, {"label": bytes_list["cat"]},
# {"xy": float_list[1.0, -2.0]}}}, written out by hand from the protobuf encoding rules.
GOLDEN_FEATURES = {
    "xy": ("float", np.array([1.0, -2.0], np.float32)),
    "label": ("bytes", [b"cat"]),
    "id": ("int64", np.array([-1, 150])),
}
GOLDEN = bytes.fromhex(
    "0a3e"  # Example.features (field 1, LEN 62)
    "0a16"  # Features.feature map entry (LEN 22)
    "0a026964"  # key "id"
    "1210"  # value: Feature (LEN 16)
    "1a0e"  # Feature.int64_list (field 3, LEN 14)
    "0a0c"  # Int64List.value packed (LEN 12)
    "ffffffffffffffffff01"  # -1: ten-byte two's complement varint
    "9601"  # 150
    "0a10"  # entry (LEN 16)
    "0a056c6162656c"  # key "label"
    "1207"  # value (LEN 7)
    "0a05"  # Feature.bytes_list (field 1, LEN 5)
    "0a03636174"  # BytesList.value "cat"
    "0a12"  # entry (LEN 18)
    "0a027879"  # key "xy"
    "120c"  # value (LEN 12)
    "120a"  # Feature.float_list (field 2, LEN 10)
    "0a08"  # FloatList.value packed (LEN 8)
    "0000803f000000c0"  # 1.0, -2.0 little-endian float32
)


def assert_same_features(got: dict, want: dict) -> None:
    assert set(got) == set(want)
    for key, (kind, values) in want.items():
        got_kind, got_values = got[key]
        assert got_kind == kind, key
        if kind is None:
            assert got_values is None
        elif kind == "bytes":
            assert got_values == [
                bytes(v) if not isinstance(v, str) else v.encode() for v in values
            ]
        else:
            dtype = np.float32 if kind == "float" else np.int64
            assert got_values.dtype == dtype
            want_arr = np.asarray(values, dtype).ravel()
            assert np.array_equal(got_values, want_arr, equal_nan=kind == "float"), key


def test_encoder_golden_bytes():
    assert encode_example(GOLDEN_FEATURES) == GOLDEN  # keys sorted: id, label, xy
    decoded = decode_example(GOLDEN)
    assert list(decoded) == ["id", "label", "xy"]
    assert_same_features(decoded, GOLDEN_FEATURES)


def test_unsorted_keys_when_asked():
    body = encode_example(GOLDEN_FEATURES, sort_keys=False)
    assert list(decode_example(body)) == ["xy", "label", "id"]


ROUND_TRIPS = {
    "negative and extreme ints": {
        "i": ("int64", np.array([0, -1, 1, -(2**63), 2**63 - 1, 127, 128, -128, 2**35] * 3))
    },
    "one int": {"label": ("int64", [7])},
    "bools and uints": {
        "b": ("int64", np.array([True, False])),
        "u": ("int64", np.uint32([7, 2**32 - 1])),
    },
    "empty lists": {"f": ("float", []), "i": ("int64", []), "b": ("bytes", [])},
    "no kind": {"nothing": (None, None)},
    "no features": {},
    "unicode keys": {
        "画像": ("bytes", [b"\xff\x00"]),
        "é": ("int64", [1]),
        "🙂 key": ("float", [0.5]),
    },
    "floats": {
        "v": ("float", np.array([[0.0, -0.0], [np.inf, np.nan]], np.float32)),
        "d": ("float", [1e-45, 3.4e38]),
    },
    "bytes": {"img": ("bytes", [os.urandom(20_000), b"", bytearray(b"ba"), "text é"])},
    "many ints": {"seq": ("int64", np.arange(-5000, 5000) * 1_000_003)},
}


@pytest.mark.parametrize("features", ROUND_TRIPS.values(), ids=ROUND_TRIPS.keys())
def test_example_round_trip(features):
    data = encode_example(features)
    assert_same_features(decode_example(data), features)
    assert_same_features(decode_example(memoryview(data)), features)
    assert_same_features(decode_example(bytearray(data)), features)
    assert encode_example(features) == data  # deterministic


def test_decoded_arrays_are_owned():
    features = decode_example(
        encode_example({"f": ("float", [1.0, 2.0]), "i": ("int64", [1] * 40)})
    )
    for _, values in features.values():
        assert values.flags.writeable  # a view of the (immutable) record would be read-only


feature_values = st.one_of(
    st.tuples(st.just("bytes"), st.lists(st.binary(max_size=40), max_size=5)),
    st.tuples(
        st.just("float"),
        st.lists(st.floats(width=32, allow_nan=True), max_size=20).map(
            lambda v: np.array(v, np.float32)
        ),
    ),
    st.tuples(
        st.just("int64"),
        st.lists(st.integers(-(2**63), 2**63 - 1), max_size=30).map(
            lambda v: np.array(v, np.int64)
        ),
    ),
    st.just((None, None)),
)
examples = st.dictionaries(st.text(max_size=8), feature_values, max_size=6)


@FUZZ_EXAMPLES
@given(examples)
def test_example_round_trip_property(features):
    data = encode_example(features)
    decoded = decode_example(data)
    assert list(decoded) == sorted(features)
    assert_same_features(decoded, features)


# ---------------------------------------------------------------------------------------------------
# Hand-built encodings the encoder never writes: unpacked lists, unknown fields, merging


def varint(value: int) -> bytes:
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        out.append((value & 0x7F) | (0x80 if value > 0x7F else 0))
        value >>= 7
        if not value:
            return bytes(out)


def field(number: int, wire: int, payload: bytes = b"") -> bytes:
    tag = varint(number << 3 | wire)
    return tag + (varint(len(payload)) + payload if wire == 2 else payload)


def example(*entries: bytes, extra: bytes = b"") -> bytes:
    return field(1, 2, b"".join(field(1, 2, e) for e in entries) + extra)


def entry(key: str, feature: bytes) -> bytes:
    return field(1, 2, key.encode()) + field(2, 2, feature)


def f32(*values: float) -> bytes:
    return struct.pack(f"<{len(values)}f", *values)


def test_unpacked_floats_and_ints():
    floats = b"".join(field(1, 5, f32(v)) for v in (1.5, -2.0, 3.25))
    ints = b"".join(field(1, 0, varint(v)) for v in (-3, 0, 2**40))
    data = example(entry("f", field(2, 2, floats)), entry("i", field(3, 2, ints)))
    got = decode_example(data)
    assert got["f"][0] == "float" and got["f"][1].tolist() == [1.5, -2.0, 3.25]
    assert got["i"][0] == "int64" and got["i"][1].tolist() == [-3, 0, 2**40]


def test_packed_and_unpacked_mixed_in_order():
    floats = field(1, 2, f32(1, 2)) + field(1, 5, f32(3)) + field(1, 2, f32(4, 5))
    long_packed = b"".join(varint(v) for v in range(-20, 20))  # > 16 bytes: the numpy decoder
    ints = field(1, 0, varint(9)) + field(1, 2, long_packed) + field(1, 2, varint(-1) + varint(5))
    got = decode_example(example(entry("f", field(2, 2, floats)), entry("i", field(3, 2, ints))))
    assert got["f"][1].tolist() == [1, 2, 3, 4, 5]
    assert got["i"][1].tolist() == [9, *range(-20, 20), -1, 5]


def test_unknown_fields_are_skipped_at_every_level():
    unknown = (
        field(7, 0, varint(300))
        + field(8, 1, b"\x01" * 8)
        + field(9, 2, b"junk")
        + field(10, 5, b"\x02" * 4)
        + field(11, 3)
        + field(12, 0, varint(1))
        + field(13, 3)
        + field(13, 4)
        + field(11, 4)  # a group holding a field and a nested group
        + field(2**29 - 1, 0, varint(5))  # the highest field number
    )
    bytes_list = field(1, 2, field(1, 2, b"v") + unknown)
    feature = bytes_list + unknown
    data = example(entry("k", feature) + unknown, extra=unknown) + unknown
    assert decode_example(data) == {"k": ("bytes", [b"v"])}


def test_wrong_wire_types_are_unknown_fields():
    floats = field(1, 0, varint(5)) + field(1, 5, f32(2))  # a varint in a FloatList: unknown
    ints = field(1, 5, f32(1)) + field(1, 0, varint(4))  # a fixed32 in an Int64List: unknown
    bytes_list = field(1, 0, varint(1)) + field(1, 2, b"ok")
    data = example(
        entry("f", field(2, 2, floats)),
        entry("i", field(3, 2, ints)),
        entry("b", field(1, 2, bytes_list) + field(2, 0, varint(3))),
    ) + field(1, 0, varint(1))
    got = decode_example(data)
    assert got["f"][1].tolist() == [2.0]
    assert got["i"][1].tolist() == [4]
    assert got["b"] == ("bytes", [b"ok"])


def test_merging_rules():
    # features twice: merged; the same key twice: the later entry wins
    data = example(entry("a", field(3, 2, field(1, 0, varint(1))))) + example(
        entry("b", field(1, 2, field(1, 2, b"x"))), entry("a", field(2, 2, field(1, 5, f32(7))))
    )
    got = decode_example(data)
    assert got["a"][0] == "float" and got["a"][1].tolist() == [7.0]
    assert got["b"] == ("bytes", [b"x"])
    # one Feature: the same kind twice concatenates, another kind replaces
    same = field(3, 2, field(1, 0, varint(1))) + field(3, 2, field(1, 0, varint(2)))
    assert decode_example(example(entry("k", same)))["k"][1].tolist() == [1, 2]
    other = field(3, 2, field(1, 0, varint(1))) + field(1, 2, field(1, 2, b"z"))
    assert decode_example(example(entry("k", other)))["k"] == ("bytes", [b"z"])
    # the value message twice in one entry: merged
    twice = field(1, 2, b"k") + field(2, 2, field(1, 2, field(1, 2, b"p")))
    twice += field(2, 2, field(1, 2, field(1, 2, b"q")))
    assert decode_example(field(1, 2, field(1, 2, twice))) == {"k": ("bytes", [b"p", b"q"])}


def test_entry_defaults():
    assert decode_example(example(field(2, 2, field(1, 2, b"")))) == {"": ("bytes", [])}
    assert decode_example(example(field(1, 2, b"k"))) == {"k": (None, None)}
    assert decode_example(example(b"")) == {"": (None, None)}
    assert decode_example(b"") == {}
    assert decode_example(field(1, 2)) == {}


MALFORMED = {
    "truncated varint": (b"\x0a\x80", "truncated varint"),
    "truncated tag": (b"\x80", "truncated varint"),
    "long varint": (b"\x08" + b"\xff" * 10 + b"\x01", "longer than 10 bytes"),
    "long tag": (b"\x88\x80\x80\x80\x80\x00", "tag longer than 32 bits"),
    "field 0": (b"\x00\x00", "field number 0"),
    "wire type 6": (b"\x0e", "bad wire type 6"),
    "wire type 7": (example(entry("k", b"\x0f")), "bad wire type 7"),
    "length past end": (b"\x0a\x05abc", "runs past the end"),
    "inner length past outer": (b"\x0a\x02\x0a\x05", "runs past the end"),
    "fixed64 past end": (b"\x09\x00\x00", "truncated fixed-width"),
    "end group alone": (b"\x0c", "end-group tag outside a group"),
    "unterminated group": (b"\x0b\x08\x01", "unterminated group"),
    "mismatched group": (b"\x0b\x14", "does not match"),
    "packed floats not by 4": (
        example(entry("f", field(2, 2, field(1, 2, b"\x00" * 6)))),
        "not a multiple of 4",
    ),
    "truncated unpacked float": (
        example(entry("f", field(2, 2, b"\x0d\x00\x00"))),
        "truncated fixed-width field",
    ),
    "packed varint cut short": (
        example(entry("i", field(3, 2, field(1, 2, b"\x01\x80")))),
        "truncated varint",
    ),
    "long packed varint cut short": (
        example(entry("i", field(3, 2, field(1, 2, b"\x01" * 20 + b"\x80")))),
        "truncated varint in a packed list",
    ),
    "long packed varint too long": (
        example(entry("i", field(3, 2, field(1, 2, b"\x01" * 20 + b"\xff" * 10 + b"\x01")))),
        "longer than 10 bytes",
    ),
    "bad utf-8 key": (example(field(1, 2, b"\xff\xfe")), "not valid UTF-8"),
    "surrogate key": (example(field(1, 2, b"\xed\xa0\x80")), "not valid UTF-8"),
}


@pytest.mark.parametrize(("data", "problem"), MALFORMED.values(), ids=MALFORMED.keys())
def test_malformed_examples(data, problem):
    with pytest.raises(ExampleDecodeError, match=problem) as info:
        decode_example(data)
    assert isinstance(info.value, ShardfeedError)
    assert 0 <= info.value.offset <= len(data)
    back = pickle.loads(pickle.dumps(info.value))
    assert str(back) == str(info.value)


ENCODE_ERRORS = {
    "unknown kind": ({"k": ("double", [1.0])}, "unknown kind"),
    "one bytes value": ({"k": ("bytes", b"abc")}, "must be a list"),
    "ints as bytes": ({"k": ("bytes", [1, 2])}, "must be bytes or str"),
    "floats as int64": ({"k": ("int64", [1.5])}, "must be integers"),
    "above int64": ({"k": ("int64", np.array([2**64 - 1], np.uint64))}, "above the int64 range"),
    "huge python int": ({"k": ("int64", [2**70])}, "must be integers"),
    "strings as floats": ({"k": ("float", ["1.5"])}, "must be numbers"),
    "values for no kind": ({"k": (None, [1])}, "kind None takes values None"),
    "not a pair": ({"k": [1.0]}, "expected a \\(kind, values\\) pair"),
    "bytes key": ({b"k": ("int64", [1])}, "is not a str"),
    "surrogate key": ({"\ud800": ("int64", [1])}, "not valid Unicode"),
}


@pytest.mark.parametrize(("features", "problem"), ENCODE_ERRORS.values(), ids=ENCODE_ERRORS.keys())
def test_encode_errors(features, problem):
    with pytest.raises(ExampleEncodeError, match=problem):
        encode_example(features)


@FUZZ
@given(st.binary(max_size=200))
def test_fuzz_decoder_random_bytes(data):
    with contextlib.suppress(ExampleDecodeError):
        decode_example(data)


def mutate(data: bytes, edits: list[tuple[int, int, str]]) -> bytes:
    out = bytearray(data)
    for at, value, op in edits:
        at %= len(out) + 1
        if op == "s" and at < len(out):
            out[at] = value
        elif op == "d":
            del out[at : at + 1]
        elif op == "i":
            out[at:at] = bytes([value])
        else:
            del out[at:]
    return bytes(out)


edits = st.lists(
    st.tuples(st.integers(0, 10**6), st.integers(0, 255), st.sampled_from("sdit")),
    min_size=1,
    max_size=4,
)


@FUZZ_EXAMPLES
@given(examples, edits)
def test_fuzz_decoder_mutated_examples(features, changes):
    with contextlib.suppress(ExampleDecodeError):
        decode_example(mutate(encode_example(features), changes))


# ---------------------------------------------------------------------------------------------------
# Cross-check against the real protobuf package (Example descriptors built at run time)


@pytest.fixture(scope="module")
def pb_example():
    # protobuf is in the [dev] extra: a missing one fails here, never skips the cross-check
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    proto = descriptor_pb2.FileDescriptorProto(
        name="shardfeed_test/example.proto", package="shardfeed_test", syntax="proto3"
    )
    fd = descriptor_pb2.FieldDescriptorProto
    optional, repeated = fd.LABEL_OPTIONAL, fd.LABEL_REPEATED
    for name, kind in (
        ("BytesList", fd.TYPE_BYTES),
        ("FloatList", fd.TYPE_FLOAT),
        ("Int64List", fd.TYPE_INT64),
    ):
        proto.message_type.add(name=name).field.add(
            name="value", number=1, type=kind, label=repeated
        )
    feature = proto.message_type.add(name="Feature")
    feature.oneof_decl.add(name="kind")
    for number, name in enumerate(("bytes_list", "float_list", "int64_list"), 1):
        type_name = ".shardfeed_test." + name.title().replace("_", "")
        feature.field.add(
            name=name,
            number=number,
            type=fd.TYPE_MESSAGE,
            label=optional,
            type_name=type_name,
            oneof_index=0,
        )
    features = proto.message_type.add(name="Features")
    features.field.add(
        name="feature",
        number=1,
        type=fd.TYPE_MESSAGE,
        label=repeated,
        type_name=".shardfeed_test.Features.FeatureEntry",
    )
    map_entry = features.nested_type.add(name="FeatureEntry")
    map_entry.field.add(name="key", number=1, type=fd.TYPE_STRING, label=optional)
    map_entry.field.add(
        name="value",
        number=2,
        type=fd.TYPE_MESSAGE,
        label=optional,
        type_name=".shardfeed_test.Feature",
    )
    map_entry.options.map_entry = True
    proto.message_type.add(name="Example").field.add(
        name="features",
        number=1,
        type=fd.TYPE_MESSAGE,
        label=optional,
        type_name=".shardfeed_test.Features",
    )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("shardfeed_test.Example"))


def pb_to_features(message) -> dict:
    out = {}
    for key, feature in message.features.feature.items():
        kind = feature.WhichOneof("kind")
        if kind is None:
            out[key] = (None, None)
        elif kind == "bytes_list":
            out[key] = ("bytes", list(feature.bytes_list.value))
        elif kind == "float_list":
            out[key] = ("float", np.array(feature.float_list.value, np.float32))
        else:
            out[key] = ("int64", np.array(feature.int64_list.value, np.int64))
    return out


def features_to_pb(message_class, features: dict):
    message = message_class()
    message.features.SetInParent()
    for key, (kind, values) in features.items():
        feature = message.features.feature[key]
        if kind == "bytes":
            feature.bytes_list.value.extend(values)
        elif kind == "float":
            feature.float_list.value.extend(values.tolist())
        elif kind == "int64":
            feature.int64_list.value.extend(values.tolist())
    return message


def test_protobuf_parses_the_golden_example(pb_example):
    message = pb_example()
    message.ParseFromString(GOLDEN)
    assert_same_features(pb_to_features(message), GOLDEN_FEATURES)


@FUZZ_EXAMPLES
@given(examples)
def test_protobuf_agrees_both_ways(pb_example, features):
    ours = encode_example(features)
    message = pb_example()
    message.ParseFromString(ours)
    assert_same_features(pb_to_features(message), features)
    theirs = features_to_pb(pb_example, features).SerializeToString()
    assert_same_features(decode_example(theirs), features)
    if len(features) <= 1:  # upb sorts string map keys in its own order; one entry has none
        assert features_to_pb(pb_example, features).SerializeToString(deterministic=True) == ours


def read_fields(data: bytes) -> list[tuple[int, bytes]] | None:
    """``[(tag, payload)]`` of a message body (a group's payload is its inner bytes); None when it
    does not parse."""

    def read_varint(pos: int) -> tuple[int, int]:
        value, shift = 0, 0
        while pos < len(data):
            value |= (data[pos] & 0x7F) << shift
            pos, shift = pos + 1, shift + 7
            if not data[pos - 1] & 0x80:
                return value, pos
        raise IndexError

    fields, pos = [], 0
    try:
        while pos < len(data):
            tag, pos = read_varint(pos)
            wire = tag & 7
            if wire == 0:
                start = pos
                pos = read_varint(pos)[1]
            elif wire in (1, 5):
                start = pos
                pos += 8 if wire == 1 else 4
            elif wire == 2:
                size, start = read_varint(pos)
                pos = start + size
            elif wire == 3:  # skip to the matching end-group tag
                start, depth = pos, 1
                while depth:
                    inner, pos = read_varint(pos)
                    depth += {3: 1, 4: -1}.get(inner & 7, 0)
                    if inner & 7 in (0, 1, 2, 5):
                        if inner & 7 == 0:
                            pos = read_varint(pos)[1]
                        elif inner & 7 == 2:
                            size, pos = read_varint(pos)
                            pos += size
                        else:
                            pos += 8 if inner & 7 == 1 else 4
            else:
                return None
            if pos > len(data):
                return None
            fields.append((tag, data[start:pos]))
    except IndexError:
        return None
    return fields


def map_entry_has_other_fields(data: bytes) -> bool:
    """True when a Features map entry holds a field besides key and value (or the walk cannot
    tell): upb then drops the entry into the unknown fields of Features, where C++ protobuf (and
    this decoder) keep it."""
    top = read_fields(data)
    if top is None:
        return True
    for tag, features in top:
        if tag != 0x0A:
            continue
        entries = read_fields(features)
        if entries is None:
            return True
        for entry_tag, entry_body in entries:
            entry_fields = read_fields(entry_body) if entry_tag == 0x0A else []
            if entry_fields is None or any(t not in (0x0A, 0x12) for t, _ in entry_fields):
                return True
    return False


def test_upb_drops_map_entries_with_unknown_fields(pb_example):
    """The one known divergence from upb (protobuf's Python backend), pinned so a change shows."""
    data = example(entry("k", field(1, 2, field(1, 2, b"v"))) + field(7, 0, varint(1)))
    assert decode_example(data) == {"k": ("bytes", [b"v"])}
    assert map_entry_has_other_fields(data)
    message = pb_example()
    message.ParseFromString(data)
    assert pb_to_features(message) in ({}, {"k": ("bytes", [b"v"])})


@FUZZ_EXAMPLES
@given(examples, edits)
def test_protobuf_accepts_and_rejects_what_we_do(pb_example, features, changes):
    """Differential fuzzing: on mutated bytes, both parsers fail, or both give the same features."""
    from google.protobuf.message import DecodeError

    data = mutate(encode_example(features), changes)
    message = pb_example()
    try:
        message.ParseFromString(data)
    except DecodeError:
        with pytest.raises(ExampleDecodeError):
            decode_example(data)
        return
    if not map_entry_has_other_fields(data):
        assert_same_features(decode_example(data), pb_to_features(message))
    else:
        decode_example(data)  # C++ semantics: the entry stays; it must still parse
