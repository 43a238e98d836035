"""Parquet table source: listing, kinds and the feature mapping, schema drift and its safe
promotions, corrupt files, row digests, by-row-group reads, and whole conversions through the CLI
read back value by value."""

from __future__ import annotations

import base64
import io
import json
import os
from functools import reduce
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from shardfeed import open_dataset
from shardfeed.formats.sources import detect_kind, open_source
from shardfeed.formats.sources.parquet_table import (
    InferredParquet,
    ParquetSource,
    column_kind,
    join_kinds,
    kind_promotes,
    merge_inferred,
    row_digests,
)
from shardfeed.schemas.errors import ShardfeedError

IMAGE = pa.struct([("bytes", pa.binary()), ("path", pa.string())])


def png(seed: int) -> bytes:
    """A small real PNG whose size varies with ``seed``."""
    rng = np.random.default_rng(seed)
    side = 4 + seed % 9
    pixels = rng.integers(0, 256, size=(side, side + 2, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "PNG")
    return out.getvalue()


def rows_table(start: int, n: int, *, id_type: pa.DataType | None = None) -> pa.Table:
    """``n`` rows with ids from ``start``: every column kind the issue lists, and a nullable one."""
    ids = np.arange(start, start + n)
    return pa.table(
        {
            "id": pa.array(ids, id_type or pa.int64()),
            "score": pa.array(ids / 7.0, pa.float64()),
            "caption": pa.array([f"caption {i} " + "x" * (i % 13) for i in ids]),
            "blob": pa.array([bytes([i % 256]) * (i % 6) for i in ids], pa.binary()),
            "state": pa.array([[i, i + 0.5, -i] for i in ids.tolist()], pa.list_(pa.float32(), 3)),
            "action": pa.array(
                [[i, 1.0, 2.0, i / 2] for i in ids.tolist()], pa.list_(pa.float32())
            ),
            "image": pa.array([{"bytes": png(i), "path": f"img/{i}.png"} for i in ids], IMAGE),
            "maybe": pa.array([None if i % 3 == 0 else int(i) * 2 for i in ids], pa.int32()),
        }
    )


def write(path: Path, table: pa.Table, row_group_size: int = 5) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path, row_group_size=row_group_size)
    return path


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    """Three files in a tree (43 rows, row groups of 5), plus files the listing must skip."""
    root = tmp_path / "src"
    write(root / "part-0.parquet", rows_table(0, 17))
    write(root / "b" / "part-1.parquet", rows_table(17, 12))
    write(root / "b" / "c" / "part-2.parquet", rows_table(29, 14), row_group_size=4)
    (root / "_SUCCESS").write_text("")
    write(root / "_temporary" / "x.parquet", rows_table(100, 2))
    write(root / ".hidden.parquet", rows_table(200, 2))
    (root / "notes.txt").write_text("not an input")
    return root


def source_rows(root: Path, files: list[str]) -> dict[int, dict]:
    rows = {}
    for file in files:
        for row in pq.read_table(root / file).to_pylist():
            rows[row["id"]] = row
    return rows


def merged(source: ParquetSource) -> InferredParquet:
    return reduce(merge_inferred, (source.infer(f) for f in source.files()), InferredParquet())


def convert(src: Path | str, dst: Path, *flags: str, capsys) -> dict:
    from shardfeed.cli.main import main

    capsys.readouterr()
    code = main(["convert", str(src), str(dst), "--json", *flags])
    out = capsys.readouterr().out
    assert code == 0, out
    return json.loads(out)


def tree(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def rejects_of(dst: Path) -> list[dict]:
    manifest = json.loads((dst / "meta/shardfeed/manifest.json").read_text())
    paths = [
        f["path"] for f in manifest["files"] if f["path"].startswith("meta/shardfeed/rejects/")
    ]
    return [json.loads(line) for p in paths for line in (dst / p).read_text().splitlines()]


# --------------------------------------------------------------------------------------------
# listing, kinds, spec


def test_files_are_sorted_and_skip_hidden_names(corpus: Path) -> None:
    expected = ["b/c/part-2.parquet", "b/part-1.parquet", "part-0.parquet"]
    assert ParquetSource(corpus).files() == expected
    single = ParquetSource(corpus / "b" / "part-1.parquet")
    assert single.files() == ["part-1.parquet"] and single.root == str(corpus / "b")
    globbed = ParquetSource(str(corpus / "**" / "part-*.parquet"))
    assert globbed.files() == expected and globbed.root == str(corpus)
    with pytest.raises(ShardfeedError, match="does not exist"):
        ParquetSource(corpus / "nope")


def test_detect_kind(corpus: Path, tmp_path: Path, capsys) -> None:
    assert detect_kind(str(corpus)) == "parquet"
    assert detect_kind(str(corpus / "part-0.parquet")) == "parquet"
    assert detect_kind(str(corpus / "*.parquet")) == "parquet"
    assert isinstance(open_source(str(corpus)), ParquetSource)
    # a converted dataset holds Parquet files too, but it is a LeRobot dataset
    dst = tmp_path / "out"
    convert(corpus / "part-0.parquet", dst, capsys=capsys)
    assert detect_kind(str(dst)) == "lerobot"


@pytest.mark.parametrize(
    ("atype", "kind"),
    [
        (pa.int32(), "int32"),
        (pa.bool_(), "bool"),
        (pa.large_string(), "string"),
        (pa.dictionary(pa.int32(), pa.string()), "string"),
        (pa.binary(4), "binary"),
        (IMAGE, "image"),
        (pa.struct([("bytes", pa.large_binary()), ("path", pa.string())]), "image"),
        (pa.struct([("bytes", pa.binary()), ("x", pa.string())]), "nested"),
        (pa.list_(pa.float32(), 3), "list<float32>"),
        (pa.large_list(pa.list_(pa.int64())), "list<list<int64>>"),
        (pa.list_(pa.string()), "nested"),
        (pa.map_(pa.string(), pa.int64()), "nested"),
        (pa.timestamp("ms"), "timestamp[ms]"),
        (pa.null(), "null"),
    ],
)
def test_column_kinds(atype: pa.DataType, kind: str) -> None:
    assert column_kind(atype) == kind


def test_promotion_rules() -> None:
    assert kind_promotes("int32", "int64", None)
    assert kind_promotes("uint8", "int16", None)
    assert kind_promotes("float32", "float64", None)
    assert kind_promotes("int32", "float64", None)  # always exact
    assert not kind_promotes("int64", "float64", None)  # unknown values
    assert kind_promotes("int64", "float64", 2**53)
    assert not kind_promotes("int64", "float64", 2**53 + 1)
    assert not kind_promotes("int64", "int32", 0)  # never narrows
    assert not kind_promotes("int32", "float32", None)  # integers become float64 only
    assert not kind_promotes("float64", "int64", None)
    assert not kind_promotes("bool", "int8", None)
    assert not kind_promotes("string", "binary", None)
    assert kind_promotes("list<int32>", "list<int64>", None)
    assert not kind_promotes("list<int32>", "list<list<int32>>", None)
    assert join_kinds("int32", 2**31, "int64", 5) == ("int64", 2**31)
    assert join_kinds("uint32", 2**32 - 1, "int32", 2**31) == ("int64", 2**32 - 1)
    assert join_kinds("int16", 2**15, "float32", 0) == ("float64", 2**15)
    assert join_kinds("int64", None, "float64", 0) is None
    assert join_kinds("int64", 10, "uint64", 10) == ("float64", 10)
    assert join_kinds("string", 0, "int64", 0) is None


def test_spec_maps_every_column_kind(corpus: Path) -> None:
    source = ParquetSource(corpus)
    features = source.spec(merged(source)).to_json()
    assert list(features) == [
        "id",
        "score",
        "caption",
        "blob",
        "state",
        "action",
        "image",
        "maybe",
    ]
    shapes = {name: (f["dtype"], f["shape"]) for name, f in features.items()}
    assert shapes == {
        "id": ("int64", [1]),
        "score": ("float64", [1]),
        "caption": ("string", [1]),
        "blob": ("string", [1]),
        "state": ("float32", [3]),
        "action": ("float32", [4]),
        "image": ("image", []),
        "maybe": ("int32", [1]),
    }
    assert features["blob"]["encoding"] == "base64"
    with pytest.raises(ShardfeedError, match="no inferred schema"):
        source.spec(None)


def test_lists_become_tensors_only_when_constant_and_null_free(tmp_path: Path) -> None:
    nested = pa.list_(pa.list_(pa.float32()))
    write(
        tmp_path / "a.parquet",
        pa.table(
            {
                "grid": pa.array([[[i, 1.0, 2.0], [3.0, 4.0, i]] for i in range(6)], nested),
                "one": pa.array([[i] for i in range(6)], pa.list_(pa.int16())),
                "ragged": pa.array([[1.5] * (i % 3) for i in range(6)], pa.list_(pa.float64())),
                "holey": pa.array([[1, 2], [3, None]] * 3, pa.list_(pa.int64())),
                "gappy": pa.array([[1, 2], None] * 3, pa.list_(pa.int64())),
                "tags": pa.array([["a", "b"]] * 6, pa.list_(pa.string())),
            }
        ),
        row_group_size=4,
    )
    source = ParquetSource(tmp_path)
    spec = source.spec(merged(source))
    assert (spec["grid"].dtype, spec["grid"].shape) == ("float32", (2, 3))
    assert (spec["one"].dtype, spec["one"].shape) == ("int16", (1,))
    for name in ("ragged", "holey", "gappy"):
        assert spec[name].dtype == "string"
        assert spec[name].extra == {
            "encoding": "json",
            "parquet_type": spec[name].extra["parquet_type"],
        }
    assert spec["tags"].extra == {"encoding": "json", "parquet_type": "nested"}
    result = source.scan("a.parquet", spec)
    assert not result.rejects and len(result.units) == 6
    table = source.read(result.units, spec)
    assert table.column("grid").to_pylist()[5] == [[5.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
    assert table.column("one").to_pylist() == list(range(6))
    assert table.column("ragged").to_pylist()[:3] == ["[]", "[1.5]", "[1.5,1.5]"]
    assert table.column("holey").to_pylist()[:2] == ["[1,2]", "[3,null]"]
    assert table.column("gappy").to_pylist()[:2] == ["[1,2]", None]
    assert table.column("tags").to_pylist()[0] == '["a","b"]'


def test_nan_in_a_json_list_is_a_row_reject(tmp_path: Path) -> None:
    values = [[1.0], [float("nan"), 2.0], [3.0, 4.0]]
    write(tmp_path / "a.parquet", pa.table({"v": pa.array(values, pa.list_(pa.float64()))}))
    source = ParquetSource(tmp_path)
    spec = source.spec(merged(source))
    result = source.scan("a.parquet", spec)
    assert [u.position for u in result.units] == [0, 2]
    [reject] = result.rejects
    assert (reject.position, reject.reason) == ("row:1", "field_type")
    assert "canonical JSON" in reject.message


def test_other_types_become_text(tmp_path: Path) -> None:
    import datetime
    import decimal

    table = pa.table(
        {
            "d": pa.array(["a", "b", None, "a"]).dictionary_encode(),
            "ts": pa.array(
                [datetime.datetime(2024, 1, 1, 12), None, datetime.datetime(2024, 1, 2), None],
                pa.timestamp("ms"),
            ),
            "dec": pa.array([decimal.Decimal("1.25"), None, decimal.Decimal("3.5"), None]),
            "st": pa.array([{"b": b"\x00\x01", "a": 1}, None, {"b": None, "a": 2}, None]),
            "m": pa.array([[("k", 1)], None, [], None], pa.map_(pa.string(), pa.int64())),
            "nothing": pa.nulls(4),
        }
    )
    write(tmp_path / "a.parquet", table, row_group_size=3)
    source = ParquetSource(tmp_path)
    spec = source.spec(merged(source))
    assert [f.dtype for f in spec] == ["string"] * 6
    assert spec["ts"].extra == {"parquet_type": "timestamp[ms]"}
    assert spec["st"].extra == {"encoding": "json", "parquet_type": "nested"}
    units = source.scan("a.parquet", spec).units
    out = source.read(units, spec).to_pylist()
    assert [r["d"] for r in out] == ["a", "b", None, "a"]
    assert out[0]["ts"] == "2024-01-01 12:00:00.000" and out[1]["ts"] is None
    assert out[0]["dec"] == "1.25"
    assert out[0]["st"] == '{"a":1,"b":"AAE="}' and out[2]["st"] == '{"a":2,"b":null}'
    assert [r["m"] for r in out[:3]] == ['[["k",1]]', None, "[]"]
    assert all(r["nothing"] is None for r in out)


def test_an_undecodable_row_group_is_one_reject(tmp_path: Path) -> None:
    path = tmp_path / "a.parquet"
    table = pa.table({"x": np.arange(300) * 1.5, "s": [f"row {i} " * 5 for i in range(300)]})
    pq.write_table(table, path, row_group_size=100, compression="zstd")
    column = pq.ParquetFile(path).metadata.row_group(1).column(1)
    data = bytearray(path.read_bytes())
    start = column.data_page_offset + column.total_compressed_size // 2
    data[start : start + 16] = b"\xaa" * 16
    path.write_bytes(bytes(data))
    source = ParquetSource(tmp_path)
    spec = source.spec(merged(source))
    result = source.scan("a.parquet", spec)
    [reject] = result.rejects
    assert reject.reason == "parquet_corrupt" and reject.position.startswith("row_group:")
    assert "\n" not in reject.message and "a.parquet cannot be read" in reject.message
    assert len(result.units) == 200


def test_reserved_column_names_are_refused(tmp_path: Path) -> None:
    write(tmp_path / "a.parquet", pa.table({"index": [1, 2], "x": [1.0, 2.0]}))
    source = ParquetSource(tmp_path)
    with pytest.raises(ShardfeedError, match="index"):
        source.spec(merged(source))


def test_merge_inferred_is_associative_and_commutative(corpus: Path) -> None:
    source = ParquetSource(corpus)
    a, b, c = (source.infer(f) for f in source.files())
    assert merge_inferred(a, b) == merge_inferred(b, a)
    assert merge_inferred(merge_inferred(a, b), c) == merge_inferred(a, merge_inferred(b, c))
    assert merge_inferred(InferredParquet(), a) == a
    # the fragments travel between stages as JSON
    part = json.loads(json.dumps({"files": dict(a.files)}))
    assert InferredParquet(**part) == a


# --------------------------------------------------------------------------------------------
# scan, read, digests


def test_scan_units_locate_rows_and_hash_values(corpus: Path) -> None:
    source = ParquetSource(corpus)
    spec = source.spec(merged(source))
    result = source.scan("b/c/part-2.parquet", spec)
    assert not result.rejects
    assert [u.position for u in result.units] == list(range(14))
    assert [u.locator for u in result.units][3:6] == [(0, 3), (1, 0), (1, 1)]
    assert len({u.content_hash for u in result.units}) == 14
    table = source.read(result.units, spec)
    assert table.schema == spec.arrow_schema()
    # the payload is the converted row's bytes (the image as stored)
    row = table.slice(0, 1).to_pylist()[0]
    assert result.units[0].payload_bytes == (
        8
        + 8
        + len(row["caption"])
        + len(row["blob"])
        + 12
        + 16
        + len(row["image"]["bytes"])
        + len(row["image"]["path"])
        + (0 if row["maybe"] is None else 4)
    )
    assert source.reject_location(result.units[2]) == ("b/c/part-2.parquet", "row:2")


def test_row_digests_depend_on_values_only(corpus: Path) -> None:
    source = ParquetSource(corpus)
    spec = source.spec(merged(source))
    table = source.read(source.scan("part-0.parquet", spec).units, spec)
    whole = row_digests(table)
    assert whole == row_digests(table.slice(0, 7)) + row_digests(table.slice(7))
    assert whole[3:5] == row_digests(pa.concat_tables([table.slice(3, 1), table.slice(4, 1)]))
    changed = table.set_column(1, "score", pa.array([0.0] * table.num_rows))
    assert row_digests(changed)[1:] != whole[1:] and row_digests(changed)[0] == whole[0]


def test_read_takes_whole_row_groups_in_any_order(corpus: Path, monkeypatch) -> None:
    source = ParquetSource(corpus)
    spec = source.spec(merged(source))
    units = {(u.file, u.position): u for f in source.files() for u in source.scan(f, spec).units}
    calls: list[tuple[int, tuple]] = []
    original = pq.ParquetFile.read_row_group

    def spy(self, i, *args, **kwargs):
        calls.append((i, args, tuple(sorted(kwargs.items()))))
        return original(self, i, *args, **kwargs)

    monkeypatch.setattr(pq.ParquetFile, "read_row_group", spy)
    wanted = [
        units[("part-0.parquet", 16)],
        units[("b/part-1.parquet", 0)],
        units[("part-0.parquet", 1)],
        units[("part-0.parquet", 16)],  # repeats are allowed
        units[("part-0.parquet", 3)],
    ]
    table = source.read(wanted, spec)
    assert table.column("id").to_pylist() == [16, 17, 1, 16, 3]
    # part-0's row group 0 (rows 1, 3) and 3 (row 16), part-1's row group 0: each read once
    assert sorted(c[0] for c in calls) == [0, 0, 3]
    assert source.read([], spec).num_rows == 0


def test_read_refuses_rows_changed_since_the_scan(corpus: Path) -> None:
    source = ParquetSource(corpus)
    spec = source.spec(merged(source))
    units = source.scan("part-0.parquet", spec).units
    table = pq.read_table(corpus / "part-0.parquet")
    write(corpus / "part-0.parquet", table.set_column(1, "score", pa.array([1.0] * 17)))
    with pytest.raises(ShardfeedError, match="changed since it was scanned"):
        source.read(units[2:4], spec)
    write(corpus / "part-0.parquet", table.drop_columns(["score"]))
    with pytest.raises(ShardfeedError, match="changed since it was scanned"):
        source.read(units[2:4], spec)


def test_bad_images_are_row_rejects_through_the_media_hook(tmp_path: Path) -> None:
    from shardfeed.transforms.image_policy import ImagePolicy

    images = [
        {"bytes": png(1), "path": "a.png"},
        {"bytes": png(2)[:30], "path": "cut.png"},
        {"bytes": None, "path": "elsewhere.png"},
        None,
        {"bytes": b"not an image", "path": None},
    ]
    write(tmp_path / "a.parquet", pa.table({"image": pa.array(images, IMAGE)}))
    source = ParquetSource(tmp_path, media_hook=ImagePolicy())
    spec = source.spec(merged(source))
    result = source.scan("a.parquet", spec)
    assert [u.position for u in result.units] == [0, 3]
    reasons = {r.position: r.reason for r in result.rejects}
    assert reasons["row:2"] == "field_missing"
    assert reasons["row:1"].startswith("image_") and reasons["row:4"].startswith("image_")
    assert set(reasons) == {"row:1", "row:2", "row:4"}
    table = source.read(result.units, spec)
    assert table.column("image").to_pylist() == [images[0], None]


def test_re_encoding_hook_sizes_and_rewrites_images(tmp_path: Path) -> None:
    from shardfeed.transforms.image_policy import ImagePolicy

    images = [{"bytes": png(i), "path": None} for i in range(5)]
    write(tmp_path / "a.parquet", pa.table({"image": pa.array(images, IMAGE)}))
    source = ParquetSource(tmp_path, media_hook=ImagePolicy(image_format="jpeg"))
    spec = source.spec(merged(source))
    units = source.scan("a.parquet", spec).units
    table = source.read(units, spec)
    blobs = [v["bytes"] for v in table.column("image").to_pylist()]
    assert all(b.startswith(b"\xff\xd8") for b in blobs)
    assert [u.payload_bytes for u in units] == [len(b) for b in blobs]


# --------------------------------------------------------------------------------------------
# whole conversions through the CLI


def test_convert_round_trips_every_value(corpus: Path, tmp_path: Path, capsys) -> None:
    dst = tmp_path / "out"
    summary = convert(corpus, dst, "--target-shard-size", "4KB", capsys=capsys)
    assert summary["samples_out"] == 43 and summary["rejects"]["total"] == 0
    expected = source_rows(corpus, ParquetSource(corpus).files())
    with open_dataset(dst) as ds:
        assert len(ds) == 43 and len(ds.shards) >= 3
        assert ds.verify().ok
        batch = ds.read(0, len(ds))
    assert batch["state"].shape == (43, 3) and batch["state"].dtype == np.float32
    assert batch["action"].shape == (43, 4) and batch["action"].dtype == np.float32
    ids = batch["id"].tolist()
    assert sorted(ids) == list(range(43)) and ids != list(range(43))  # shuffled
    for k, i in enumerate(ids):
        row = expected[i]
        assert batch["score"][k] == row["score"]
        assert batch["caption"][k] == row["caption"]
        assert base64.b64decode(batch["blob"][k]) == row["blob"]
        np.testing.assert_array_equal(batch["state"][k], np.float32(row["state"]))
        np.testing.assert_array_equal(batch["action"][k], np.float32(row["action"]))
        assert batch["image"][k] == row["image"]["bytes"]
        if row["maybe"] is None:
            assert np.isnan(batch["maybe"][k])
        else:
            assert batch["maybe"][k] == row["maybe"]
    info = json.loads((dst / "meta/info.json").read_text())
    assert info["features"]["state"]["shape"] == [3]
    assert info["features"]["blob"]["encoding"] == "base64"
    manifest = json.loads((dst / "meta/shardfeed/manifest.json").read_text())
    assert manifest["provenance"]["content_options"]["from"] == "parquet"


def test_convert_is_deterministic_across_running_modes(
    corpus: Path, tmp_path: Path, capsys
) -> None:
    one, two = tmp_path / "one", tmp_path / "two"
    flags = ["--target-shard-size", "4KB"]
    convert(corpus, one, *flags, capsys=capsys)
    convert(
        corpus,
        two,
        *flags,
        "--direct_running_mode=multi_processing",
        "--direct_num_workers=2",
        capsys=capsys,
    )
    assert tree(one) == tree(two)
    with open_dataset(one) as ds:
        payload = [s.payload_bytes for s in ds.shards]
        assert len(payload) >= 4 and max(payload) / np.mean(payload) <= 1.2


def drifted_corpus(root: Path) -> Path:
    write(root / "a.parquet", rows_table(0, 12))
    write(root / "b.parquet", rows_table(12, 10))
    write(root / "c.parquet", rows_table(22, 6, id_type=pa.int32()))  # int32 ids
    write(root / "d.parquet", rows_table(28, 5).drop_columns(["score"]))  # no score
    return root


def test_schema_drift_rejects_the_file_naming_it(tmp_path: Path, capsys) -> None:
    src = drifted_corpus(tmp_path / "src")
    dst = tmp_path / "out"
    summary = convert(src, dst, "--max-reject-fraction", "0.5", capsys=capsys)
    assert summary["samples_out"] == 22
    assert summary["rejects"] == {"total": 2, "by_reason": {"schema_drift": 2}}
    records = sorted(rejects_of(dst), key=lambda r: r["source"])
    assert [(r["source"], r["position"]) for r in records] == [("c.parquet", ""), ("d.parquet", "")]
    assert (
        "c.parquet: column 'id' is int32, but the dataset schema has int64" in records[0]["message"]
    )
    assert "--unify-schemas" in records[0]["message"] and "6 row(s)" in records[0]["message"]
    assert "column 'score'" in records[1]["message"] and "missing" in records[1]["message"]
    with open_dataset(dst) as ds:
        assert sorted(ds.read(0, len(ds))["id"].tolist()) == list(range(22))
        assert ds.verify().ok

    from shardfeed.cli.main import main

    capsys.readouterr()
    assert main(["rejects", str(dst), "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert "schema_drift" in json.dumps(listed) and "c.parquet" in json.dumps(listed)


def test_unify_schemas_promotes_safe_drift(tmp_path: Path, capsys) -> None:
    src = drifted_corpus(tmp_path / "src")
    dst = tmp_path / "out"
    summary = convert(src, dst, "--unify-schemas", capsys=capsys)
    assert summary["samples_out"] == 33 and summary["rejects"]["total"] == 0
    with open_dataset(dst) as ds:
        assert ds.info.features["id"].dtype == "int64"
        batch = ds.read(0, len(ds))
    order = np.argsort(batch["id"])
    assert batch["id"][order].tolist() == list(range(33))
    scores = batch["score"][order]
    np.testing.assert_array_equal(scores[:28], np.arange(28) / 7.0)
    assert np.isnan(scores[28:]).all()  # d.parquet has no score: nulls
    manifest = json.loads((dst / "meta/shardfeed/manifest.json").read_text())
    assert manifest["provenance"]["content_options"]["unify_schemas"] is True


def test_unify_schemas_still_rejects_unsafe_drift(tmp_path: Path) -> None:
    write(tmp_path / "a.parquet", pa.table({"v": pa.array([1.5, 2.5, 3.5]), "s": ["a", "b", "c"]}))
    write(tmp_path / "b.parquet", pa.table({"v": pa.array([1, 2], pa.int64()), "s": ["d", "e"]}))
    write(tmp_path / "c.parquet", pa.table({"v": pa.array([2**60], pa.int64()), "s": ["f"]}))
    write(tmp_path / "d.parquet", pa.table({"v": pa.array([1.0]), "s": pa.array([7], pa.int8())}))
    source = ParquetSource(tmp_path, unify_schemas=True)
    resolved = source.resolve(merged(source))
    assert resolved.spec["v"].dtype == "float64" and resolved.spec["s"].dtype == "string"
    assert resolved.accepted == ("a.parquet", "b.parquet")
    assert set(resolved.drifted) == {"c.parquet", "d.parquet"}
    for file in ("c.parquet", "d.parquet"):
        [reject] = source.scan(file, resolved.spec).rejects
        assert (reject.source, reject.reason) == (file, "schema_drift")
        assert "no lossless promotion" in reject.message
    units = source.scan("b.parquet", resolved.spec).units
    assert source.read(units, resolved.spec).column("v").to_pylist() == [1.0, 2.0]


def test_corrupt_files_are_rejects_and_the_rest_converts(
    corpus: Path, tmp_path: Path, capsys
) -> None:
    good = (corpus / "b" / "part-1.parquet").read_bytes()
    footer = int.from_bytes(good[-8:-4], "little")  # the footer's length, before "PAR1"
    start = len(good) - 8 - footer
    (corpus / "b" / "part-1.parquet").write_bytes(good[:start] + b"\xff" * footer + good[-8:])
    (corpus / "text.parquet").write_text("just text")
    dst = tmp_path / "out"
    summary = convert(corpus, dst, "--max-reject-fraction", "0.5", capsys=capsys)
    assert summary["samples_out"] == 31
    assert summary["rejects"] == {"total": 2, "by_reason": {"parquet_corrupt": 2}}
    records = {r["source"]: r for r in rejects_of(dst)}
    assert set(records) == {"b/part-1.parquet", "text.parquet"}
    assert all(r["position"] == "" for r in records.values())
    assert (
        "b/part-1.parquet is not a readable Parquet file" in records["b/part-1.parquet"]["message"]
    )
    with open_dataset(dst) as ds:
        assert sorted(ds.read(0, len(ds))["id"].tolist()) == [*range(17), *range(29, 43)]
        assert ds.verify().ok


def test_hf_image_rows_convert_from_a_single_file_and_keep_order(tmp_path: Path, capsys) -> None:
    path = write(tmp_path / "train.parquet", rows_table(0, 9), row_group_size=2)
    dst = tmp_path / "out"
    summary = convert(path, dst, "--no-shuffle", capsys=capsys)
    assert summary["samples_out"] == 9
    with open_dataset(dst) as ds:
        batch = ds.read(0, 9)
        assert batch["id"].tolist() == list(range(9))
        assert batch["image"].tolist() == [png(i) for i in range(9)]
        assert ds[4]["caption"] == "caption 4 xxxx"


@pytest.mark.parametrize("flag", ["--unify-schemas"])
def test_cli_help_lists_the_flag(flag: str, capsys) -> None:
    from shardfeed.cli.main import main

    with pytest.raises(SystemExit):
        main(["convert", "--help"])
    assert flag in capsys.readouterr().out


def test_the_source_pickles(corpus: Path) -> None:
    import pickle

    source = ParquetSource(corpus, unify_schemas=True)
    again = pickle.loads(pickle.dumps(source))
    assert again.files() == source.files() and again.unify_schemas
    assert os.fspath(again.root) == os.fspath(source.root)
