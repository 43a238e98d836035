"""`convert --from tfrecord`: tf.train.Example records without TensorFlow, typed over all records."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from test_convert_pipeline import CORPORA, _tree, needs_corpora

from shardfeed.cli.main import main
from shardfeed.formats.reader import open_dataset
from shardfeed.formats.rejects import iter_rejects
from shardfeed.formats.sources import detect_kind
from shardfeed.formats.tf_example import decode_example, encode_example
from shardfeed.formats.tfrecord import iter_records, write_records


def png(i: int) -> bytes:
    out = io.BytesIO()
    Image.fromarray(np.full((3, 3, 3), i, dtype=np.uint8)).save(out, format="PNG")
    return out.getvalue()


def example(i: int) -> bytes:
    features = {
        "id": ("int64", [i]),
        "vec": ("float", [i, i + 0.5, -i]),
        "tags": ("bytes", [b"t"] * (i % 3 + 1)),  # varying length: JSON text
        "text": ("bytes", [f"row {i} é".encode()]),
        "img": ("bytes", [png(i)]),
        "blob": ("bytes", [bytes([255, i % 256, 0])]),  # not UTF-8, not an image: base64
    }
    if i == 7:
        features["rare"] = ("float", [1.25])  # one record in the whole corpus
    if i % 4 == 0:
        del features["text"]  # missing: null
    return encode_example(features)


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    root = tmp_path / "src"
    root.mkdir()
    write_records(root / "a.tfrecord", [example(i) for i in range(30)])
    write_records(root / "b.tfrecord.gz", [example(i) for i in range(30, 50)], compression="gzip")
    # c: a bad data CRC at record 2 (reading goes on), a non-Example, a kind conflict, then a cut
    records = [example(i) for i in range(50, 56)]
    records[3] = b"\x0a\x05\x0a\x03\x0a\x01"  # a truncated Features message
    records[4] = encode_example({"id": ("bytes", [b"not an int"])})
    offsets = write_records(root / "c.tfrecord", records)
    data = bytearray((root / "c.tfrecord").read_bytes())
    data[offsets[2] + 20] ^= 0xFF
    (root / "c.tfrecord").write_bytes(bytes(data[: offsets[5] + 30]))  # record 5 cut short
    return root


def test_every_good_record_arrives_typed_and_every_bad_one_is_a_reject(corpus, tmp_path):
    assert detect_kind(str(corpus)) == "tfrecord"
    dst = tmp_path / "ds"
    assert main(["convert", str(corpus), str(dst), "--max-reject-fraction", "0.5"]) == 0
    ds = open_dataset(dst)
    f = ds.features
    assert (f["id"].dtype, f["vec"].dtype, tuple(f["vec"].shape)) == ("int64", "float32", (3,))
    assert f["img"].dtype == "image" and f["text"].dtype == "string"
    assert f["tags"].extra["encoding"] == "json" and f["blob"].extra["encoding"] == "base64"
    assert f["rare"].dtype == "float32"  # typed from its single appearance
    rows = ds.read(0, len(ds))
    rare = rows["rare"]  # null everywhere but record 7
    assert [i for i, v in zip(rows["id"].tolist(), rare, strict=True) if v == 1.25] == [7]
    good = [i for i in range(56) if i not in (52, 53, 54, 55)]
    assert sorted(rows["id"].tolist()) == good
    for k, i in enumerate(rows["id"].tolist()):
        np.testing.assert_array_equal(rows["vec"][k], np.float32([i, i + 0.5, -i]))
        assert json.loads(rows["tags"][k]) == ["t"] * (i % 3 + 1)
        assert rows["text"][k] == (None if i % 4 == 0 else f"row {i} é")
        assert bytes(rows["img"][k]) == png(i)
        assert base64.b64decode(rows["blob"][k]) == bytes([255, i % 256, 0])
    reasons = sorted(r.reason for r in iter_rejects(ds.location, ds.manifest))
    assert reasons == ["example_invalid", "field_type", "tfrecord_data_crc", "tfrecord_truncated"]


def test_conversion_is_deterministic(corpus, tmp_path):
    for name in ("one", "two"):
        args = ["convert", str(corpus), str(tmp_path / name), "--max-reject-fraction", "0.5"]
        assert main([*args, "--target-shard-size", "5KB"]) == 0
    assert _tree(tmp_path / "one") == _tree(tmp_path / "two")


@needs_corpora
def test_the_real_chicago_taxi_corpus(tmp_path):
    src = Path(CORPORA, "tfrecord_chicago_taxi/csv_example_gen/Split-train")
    dst = tmp_path / "taxi"
    assert main(["convert", str(src), str(dst), "--no-shuffle"]) == 0
    ds = open_dataset(dst)
    assert len(ds) == 9909
    # pickup_census_tract has a value in exactly 1 of 9,909 records; it is still typed and kept
    assert ds.features["pickup_census_tract"].dtype == "int64"
    rows = ds.read(0, len(ds))
    tracts = rows["pickup_census_tract"]
    direct = [
        decode_example(data) for file in sorted(src.iterdir()) for _, data in iter_records(file)
    ]
    assert len(direct) == 9909
    present = [
        e["pickup_census_tract"][1][0]
        for e in direct
        if len(e.get("pickup_census_tract", (None, []))[1] or [])
    ]
    assert len(present) == 1 and present[0] in tracts.tolist()
    fares = np.array([e["fare"][1][0] if len(e["fare"][1]) else np.nan for e in direct], np.float32)
    np.testing.assert_array_equal(np.sort(rows["fare"].astype(np.float32)), np.sort(fares))


def test_a_link_leading_outside_the_root_is_a_reject(corpus, tmp_path):
    outside = tmp_path / "outside.tfrecord"
    write_records(outside, [example(i) for i in range(3)])
    (corpus / "escape.tfrecord").symlink_to(outside)
    dst = tmp_path / "ds"
    assert main(["convert", str(corpus), str(dst), "--max-reject-fraction", "0.5"]) == 0
    ds = open_dataset(dst)
    rejects = list(iter_rejects(ds.location, ds.manifest))
    assert [r.source for r in rejects if r.reason == "path_escape"] == ["escape.tfrecord"]


@needs_corpora
def test_the_whole_chicago_corpus_drifts_and_unifies(tmp_path, capsys):
    """``dropoff_*`` features are int64 under csv_example_gen/ and float under external/."""
    src = Path(CORPORA, "tfrecord_chicago_taxi")
    assert main(["convert", str(src), str(tmp_path / "refused")]) != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert "differs across files" in err and "--unify-schemas" in err
    assert "csv_example_gen/" in err and "external/" in err
    assert not (tmp_path / "refused" / "meta").exists()

    dst = tmp_path / "unified"
    assert main(["convert", str(src), str(dst), "--unify-schemas", "--no-shuffle"]) == 0
    ds = open_dataset(dst)
    assert len(ds) == 30_000 and ds.manifest.rejects.total == 0
    assert ds.features["dropoff_community_area"].dtype == "float64"
    values = ds.read(0, len(ds), columns=["dropoff_community_area"])["dropoff_community_area"]
    direct = [
        e["dropoff_community_area"][1][0]
        for file in sorted(p for p in src.rglob("*") if "tfrecord" in p.name and p.is_file())
        for _, data in iter_records(file)
        if len((e := decode_example(data)).get("dropoff_community_area", (None, []))[1] or [])
    ]
    present = values[~np.isnan(values.astype(np.float64))]
    assert sorted(present.tolist()) == sorted(float(v) for v in direct)


def test_unify_refuses_integers_float64_cannot_hold(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    write_records(src / "a.tfrecord", [encode_example({"x": ("int64", [2**60 + 1])})] * 50)
    write_records(src / "b.tfrecord", [encode_example({"x": ("float", [1.5])})] * 50)
    dst = tmp_path / "ds"
    assert (
        main(["convert", str(src), str(dst), "--unify-schemas", "--max-reject-fraction", "0.6"])
        == 0
    )
    ds = open_dataset(dst)
    assert len(ds) == 50 and dict(ds.manifest.rejects.by_reason) == {"field_type": 50}


def test_unify_schemas_is_refused_for_a_source_it_does_not_apply_to(tmp_path, capsys):
    src = tmp_path / "src"
    (src / "cat").mkdir(parents=True)
    (src / "cat" / "a.jpg").write_bytes(b"not read: the option is refused first")
    assert main(["convert", str(src), str(tmp_path / "ds"), "--unify-schemas"]) != 0
    err = capsys.readouterr().err
    assert "--unify-schemas applies to parquet and tfrecord and jsonl sources" in err
    assert "this source is imagefolder" in err
