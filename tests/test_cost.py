"""Per-sample cost recorded at conversion (``formats/cost.py``): each kind on real tables, the
``auto`` rule, the ``cost`` column of ``samples.parquet`` and the manifest's ``cost`` as every
writer path publishes them, bucket boundaries, determinism and the shard outcome's JSON state.
"""

from __future__ import annotations

import dataclasses
import io
import json
import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image
from test_sample_index import an_outcome, image_folder, jsonl_corpus

from shardfeed import open_dataset, write_dataset
from shardfeed.cli.main import main
from shardfeed.formats.cost import (
    CostError,
    cost_buckets,
    image_pixels,
    resolve_cost_kind,
    row_cost,
    text_tokens,
)
from shardfeed.formats.payload import table_row_bytes
from shardfeed.formats.publish import DatasetOptions, ShardOutcome
from shardfeed.formats.sample_index import (
    SampleCostMissingError,
    SampleIndexError,
    read_sample_bytes,
    read_sample_cost,
    write_sample_index,
)
from shardfeed.formats.store_path import StorePath
from shardfeed.formats.verify import verify_dataset
from shardfeed.pipelines.convert import reusable_outcome
from shardfeed.schemas import Feature, FeatureSpec, ShardfeedError
from shardfeed.schemas.manifest import (
    MANIFEST_PATH,
    SAMPLE_INDEX_PATH,
    Manifest,
    compute_fingerprint,
)

# --------------------------------------------------------------------------------------------
# helpers


def encoded(size: tuple[int, int], fmt: str = "PNG") -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, (10, 200, 30)).save(buffer, fmt)
    return buffer.getvalue()


def image_column(values: list[bytes | dict | None]) -> pa.Array:
    rows = [v if v is None or isinstance(v, dict) else {"bytes": v, "path": None} for v in values]
    return pa.array(rows, type=Feature("i", "image").arrow_type)


def expected_tokens(text: str | None) -> int:
    """The documented proxy, computed independently in Python: ceil(UTF-8 bytes / 4)."""
    return 0 if text is None else math.ceil(len(text.encode("utf-8")) / 4)


def index_columns(root: Path) -> pa.Table:
    return pq.read_table(root / SAMPLE_INDEX_PATH)


def manifest_of(root: Path) -> Manifest:
    return Manifest.loads((root / MANIFEST_PATH).read_text())


# --------------------------------------------------------------------------------------------
# the kinds on real tables


def test_tokens_are_utf8_bytes_over_four_rounded_up_summed_over_string_features():
    texts = ["", "a", "abcd", "abcde", "héllo wörld", "漢字かな交じり文", None, "x" * 4001]
    notes = ["n", None, "1234567", "", "", "ü", "zz", ""]
    spec = FeatureSpec(
        (Feature("text", "string"), Feature("n", "int64"), Feature("note", "string"))
    )
    table = pa.table(
        {"text": texts, "n": list(range(8)), "note": notes}, schema=spec.arrow_schema()
    )
    expected = [expected_tokens(a) + expected_tokens(b) for a, b in zip(texts, notes, strict=True)]
    got = row_cost(table, spec, "tokens")
    assert got.dtype == np.int64
    assert got.tolist() == expected
    assert expected[4] == 4 and expected[5] == 7  # 13 bytes -> 4; 24 + 2 bytes -> 6 + 1
    # chunked input gives the same answer
    chunked = pa.Table.from_batches(table.to_batches(max_chunksize=3))
    assert row_cost(chunked, spec, "tokens").tolist() == expected
    assert text_tokens(pa.chunked_array([], pa.string())).tolist() == []


def test_pixels_come_from_image_headers_summed_over_image_features():
    spec = FeatureSpec(
        (
            Feature("front", "image", ()),
            Feature("label", "int64"),
            Feature("wrist", "image", ()),
        )
    )
    front = [encoded((7, 5)), encoded((64, 48), "JPEG"), None, encoded((1, 1)), encoded((300, 2))]
    wrist = [encoded((3, 3), "JPEG"), None, None, encoded((10, 20), "WEBP"), encoded((2, 300))]
    table = pa.table(
        {"front": image_column(front), "label": list(range(5)), "wrist": image_column(wrist)},
        schema=spec.arrow_schema(),
    )
    assert row_cost(table, spec, "pixels").tolist() == [35 + 9, 64 * 48, 0, 1 + 200, 1200]


def test_plain_jpeg_and_png_sizes_come_without_pillow(monkeypatch):
    """The shard writer counts every image's pixels: plain JPEGs and PNGs are answered by the
    header reader, so Pillow never opens them (it took 2 s of a 24,000-image run); others
    (WebP here) still go to Pillow."""
    images = [encoded((64, 48), "JPEG"), encoded((7, 5)), encoded((10, 20), "WEBP")]
    opened = []
    real_open = Image.open

    def counting_open(*args, **kwargs):
        opened.append(args)
        return real_open(*args, **kwargs)

    monkeypatch.setattr(Image, "open", counting_open)
    assert image_pixels(image_column(images), Feature("img", "image", ())).tolist() == [
        64 * 48,
        35,
        200,
    ]
    assert len(opened) == 1  # the WebP


def with_app_segment(jpeg: bytes, size: int) -> bytes:
    """``jpeg`` with a COM segment of ``size`` bytes after SOI: its frame header moves past it."""
    return jpeg[:2] + b"\xff\xfe" + (size + 2).to_bytes(2, "big") + b"c" * size + jpeg[2:]


def test_sizes_read_from_arrow_buffers_equal_those_of_every_whole_image():
    """The writer reads each image's header from a view of the column's buffer, at first only
    its first HEAD_BYTES: a header further in (a long metadata segment), chunked and sliced
    columns, nulls and empty values give what the whole images give."""
    late = with_app_segment(encoded((33, 21), "JPEG"), 9000)  # frame header past 4 KiB
    assert len(late) > 9000 and Image.open(io.BytesIO(late)).size == (33, 21)
    cut = late[:5000]  # its header never arrives: unreadable, as a whole image
    values = [late, encoded((7, 5)), None, b"", encoded((64, 48), "JPEG"), cut, encoded((9, 9))]
    declared = Feature("img", "image", (2, 3, 3))
    expected = [33 * 21, 35, 0, 6, 64 * 48, 6, 81]
    whole = image_column(values)
    assert image_pixels(whole, declared).tolist() == expected
    chunked = pa.chunked_array([whole.slice(0, 3), whole.slice(3, 2), whole.slice(5)])
    assert image_pixels(chunked, declared).tolist() == expected
    assert image_pixels(whole.slice(4, 2), declared).tolist() == expected[4:6]
    large = pa.array(
        [None if v is None else {"bytes": v, "path": None} for v in values],
        pa.struct([("bytes", pa.large_binary()), ("path", pa.string())]),
    )
    assert image_pixels(large, declared).tolist() == expected
    assert image_pixels(whole.slice(0, 0), declared).tolist() == []


def test_unreadable_images_take_their_declared_size_or_fail_clearly():
    junk = [b"not an image", b"", encoded((4, 4))[:10]]
    # (H, W, C): the first two dimensions
    hwc = Feature("img", "image", (30, 40, 3))
    assert image_pixels(image_column([*junk, encoded((5, 5))]), hwc).tolist() == [1200] * 3 + [25]
    # names say which dimensions are height and width (LeRobot's channel-first layout)
    chw = Feature("img", "image", (3, 30, 40), names=["channel", "height", "width"])
    assert image_pixels(image_column(junk), chw).tolist() == [1200] * 3
    # a path-only image has no bytes to read
    path_only = image_column([{"bytes": None, "path": "a.png"}, None])
    assert image_pixels(path_only, hwc).tolist() == [1200, 0]
    # without a declared shape the row is named
    bare = Feature("cam", "image", ())
    with pytest.raises(CostError, match=r"image feature 'cam', row 1: no readable image header"):
        image_pixels(image_column([encoded((2, 2)), b"junk"]), bare)
    with pytest.raises(CostError, match="cost='bytes'"):
        image_pixels(path_only, bare)


def test_frames_count_one_per_row_and_bytes_are_the_payload():
    spec = FeatureSpec(
        (
            Feature("observation.state", "float32", (6,)),
            Feature("episode_index", "int64"),
            Feature("frame_index", "int64"),
        )
    )
    n = 9
    table = pa.table(
        {
            "observation.state": pa.FixedSizeListArray.from_arrays(
                pa.array(np.arange(6 * n, dtype=np.float32)), 6
            ),
            "episode_index": [0, 0, 0, 1, 1, 2, 2, 2, 2],
            "frame_index": [0, 1, 2, 0, 1, 0, 1, 2, 3],
        },
        schema=spec.arrow_schema(),
    )
    assert row_cost(table, spec, "frames").tolist() == [1] * n
    assert row_cost(table, spec, "bytes").tolist() == [24 + 8 + 8] * n
    sizes = table_row_bytes(table)
    assert row_cost(table, spec, "bytes", sizes).tolist() == sizes.tolist()
    with pytest.raises(ValueError, match="3 row sizes for a table of 9 rows"):
        row_cost(table, spec, "bytes", sizes[:3])
    with pytest.raises(CostError, match="unknown cost kind 'auto'"):
        row_cost(table, spec, "auto")


# --------------------------------------------------------------------------------------------
# auto inference and validation


@pytest.mark.parametrize(
    ("features", "kind"),
    [
        ([Feature("image", "image"), Feature("caption", "string")], "pixels"),
        ([Feature("image", "image"), Feature("episode_index", "int64")], "pixels"),
        ([Feature("text", "string"), Feature("id", "int64")], "tokens"),
        ([Feature("task", "string"), Feature("episode_index", "int64")], "tokens"),
        ([Feature("state", "float32", (6,)), Feature("episode_index", "int64")], "frames"),
        ([Feature("cam", "video", (8, 8, 3)), Feature("episode_index", "int64")], "frames"),
        ([Feature("x", "float32", (3,)), Feature("y", "int64")], "bytes"),
        # a video has no data column, so it does not make the data "pixels"
        ([Feature("cam", "video", (8, 8, 3)), Feature("x", "float32", (2,))], "bytes"),
    ],
)
def test_auto_follows_the_documented_rule(features, kind):
    spec = FeatureSpec(tuple(features))
    assert resolve_cost_kind(spec) == kind
    assert resolve_cost_kind(spec, "auto") == kind
    assert resolve_cost_kind(spec, "bytes") == "bytes"
    assert resolve_cost_kind(spec, "frames") == "frames"


def test_explicit_kinds_need_their_features_and_unknown_kinds_are_refused():
    numbers = FeatureSpec((Feature("x", "float32", (3,)),))
    with pytest.raises(CostError, match=r"cost='tokens' needs a 'string' feature.*\['x'\]"):
        resolve_cost_kind(numbers, "tokens")
    with pytest.raises(CostError, match="cost='pixels' needs a 'image' feature"):
        resolve_cost_kind(numbers, "pixels")
    with pytest.raises(CostError, match="cost must be one of"):
        resolve_cost_kind(numbers, "flops")
    with pytest.raises(ValueError, match="cost must be one of"):
        DatasetOptions(cost="flops")


def test_write_dataset_refuses_an_impossible_kind_before_writing(tmp_path):
    spec = FeatureSpec((Feature("x", "int64"),))
    with pytest.raises(CostError, match="needs a 'string' feature"):
        write_dataset(tmp_path / "ds", spec, {"x": [1, 2, 3]}, cost="tokens")
    assert not (tmp_path / "ds").exists()


# --------------------------------------------------------------------------------------------
# buckets


def test_buckets_are_quantile_boundaries():
    assert cost_buckets(np.arange(160)) == tuple(range(10, 160, 10))
    assert cost_buckets(np.arange(1600)[::-1]) == tuple(range(100, 1600, 100))
    assert cost_buckets(np.zeros(50, np.int64)) == ()  # a boundary of 0 would bound nothing
    assert cost_buckets(np.array([], np.int64)) == ()
    assert cost_buckets(np.array([7] * 90 + [1000] * 10)) == (7, 1000)
    assert cost_buckets(np.arange(100), buckets=4) == (25, 50, 75)
    assert cost_buckets(np.arange(100), buckets=1) == ()
    with pytest.raises(ValueError, match="buckets must be >= 1"):
        cost_buckets(np.arange(3), buckets=0)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(0, 2**40), min_size=0, max_size=300),
    st.integers(1, 40),
)
def test_buckets_invariants(values, buckets):
    costs = np.array(values, dtype=np.int64)
    bounds = cost_buckets(costs, buckets)
    assert all(isinstance(b, int) and b > 0 for b in bounds)
    assert list(bounds) == sorted(set(bounds))  # strictly increasing
    assert len(bounds) <= buckets - 1
    assert set(bounds) <= set(values)
    # a boundary at the k/buckets quantile has at most k*N/buckets costs below it
    n = len(values)
    for b in bounds:
        below = int((costs < b).sum())
        k = next(k for k in range(1, buckets) if np.sort(costs)[k * n // buckets] == b)
        assert below <= k * n // buckets
    assert cost_buckets(costs[::-1], buckets) == bounds  # order does not matter


# --------------------------------------------------------------------------------------------
# write_dataset publishes the column and the manifest key


def test_write_dataset_records_cost_and_buckets(make_small_dataset):
    # SMALL_SPEC has an image feature of declared shape (8, 8, 3) holding non-image bytes
    root, manifest, data = make_small_dataset("one", n=200)
    assert len(manifest.shards) >= 3
    columns = index_columns(root)
    assert columns.schema == pa.schema(
        [
            pa.field("bytes", pa.uint32(), nullable=False),
            pa.field("cost", pa.uint32(), nullable=False),
        ]
    )
    costs = columns.column("cost").to_numpy()
    assert manifest.cost is not None and manifest.cost.kind == "pixels"
    assert costs.tolist() == [0 if img is None else 64 for img in data["image"]]
    assert manifest.cost.buckets == cost_buckets(costs) == (64,)
    assert manifest.provenance.content_options["cost"] == "pixels"
    np.testing.assert_array_equal(read_sample_cost(root), costs)
    with open_dataset(root) as ds:
        np.testing.assert_array_equal(read_sample_cost(ds), costs)
    assert verify_dataset(root).ok
    two, _, _ = make_small_dataset("two", n=200)
    assert (root / SAMPLE_INDEX_PATH).read_bytes() == (two / SAMPLE_INDEX_PATH).read_bytes()
    assert (root / MANIFEST_PATH).read_bytes() == (two / MANIFEST_PATH).read_bytes()


@pytest.mark.parametrize("kind", ["tokens", "frames", "bytes"])
def test_write_dataset_records_the_kind_asked_for(make_small_dataset, kind):
    root, manifest, data = make_small_dataset(kind, n=150, cost=kind)
    costs = read_sample_cost(root)
    expected = {
        "tokens": [expected_tokens(c) for c in data["caption"]],
        "frames": [1] * 150,
        "bytes": read_sample_bytes(root).tolist(),
    }[kind]
    assert costs.tolist() == expected
    assert manifest.cost.kind == manifest.provenance.content_options["cost"] == kind
    assert manifest.cost.buckets == cost_buckets(costs)


def test_cost_changes_the_index_and_fingerprint_but_not_the_shards(make_small_dataset):
    _, pixels, _ = make_small_dataset("pixels")
    _, nbytes, _ = make_small_dataset("bytes", cost="bytes")
    assert [s.sha256 for s in pixels.shards] == [s.sha256 for s in nbytes.shards]
    assert pixels.fingerprint != nbytes.fingerprint


def test_text_costs_follow_each_sample_through_the_shuffle(tmp_path):
    spec = FeatureSpec((Feature("text", "string"), Feature("id", "int64")))
    rng = np.random.default_rng(3)
    texts = ["ab" * int(k) for k in rng.integers(0, 3000, 500)]
    manifest = write_dataset(
        tmp_path / "ds", spec, {"text": texts, "id": np.arange(500)}, target_shard_size="40KB"
    )
    assert len(manifest.shards) >= 4
    ids = open_dataset(tmp_path / "ds").read(0, 500, columns=["id"])["id"].reshape(-1)
    costs = read_sample_cost(tmp_path / "ds")
    assert costs.tolist() == [expected_tokens(texts[i]) for i in ids]
    assert manifest.cost.kind == "tokens"
    assert 10 <= len(manifest.cost.buckets) <= 15


# --------------------------------------------------------------------------------------------
# shardfeed convert


def test_convert_records_tokens_for_jsonl_and_bytes_on_request(tmp_path):
    src = jsonl_corpus(tmp_path / "src")
    one, two = tmp_path / "one", tmp_path / "two"
    args = ["--target-shard-size", "40KB"]
    assert main(["convert", str(src), str(one), *args]) == 0
    assert main(["convert", str(src), str(two), *args, "--direct_num_workers=2"]) == 0
    ds = open_dataset(one)
    assert len(ds.shards) >= 4
    strings = [f.name for f in ds.info.features if f.dtype == "string"]
    assert "text" in strings
    rows = ds.read(0, len(ds), columns=strings)
    expected = [sum(expected_tokens(rows[name][i]) for name in strings) for i in range(len(ds))]
    costs = read_sample_cost(one)
    assert costs.tolist() == expected
    assert ds.manifest.cost.kind == ds.manifest.provenance.content_options["cost"] == "tokens"
    assert ds.manifest.cost.buckets == cost_buckets(costs)
    assert (one / SAMPLE_INDEX_PATH).read_bytes() == (two / SAMPLE_INDEX_PATH).read_bytes()
    assert (one / MANIFEST_PATH).read_bytes() == (two / MANIFEST_PATH).read_bytes()
    assert verify_dataset(one).ok

    by_bytes = tmp_path / "by_bytes"
    assert main(["convert", str(src), str(by_bytes), *args, "--cost", "bytes"]) == 0
    np.testing.assert_array_equal(read_sample_cost(by_bytes), read_sample_bytes(by_bytes))
    assert open_dataset(by_bytes).manifest.cost.kind == "bytes"


def test_convert_records_pixels_for_an_image_folder(tmp_path):
    src = image_folder(tmp_path / "imgs")  # image i of a class is (8 + 3i) x 8 pixels
    dst = tmp_path / "dst"
    assert main(["convert", str(src), str(dst), "--target-shard-size", "400B"]) == 0
    ds = open_dataset(dst)
    assert len(ds.shards) >= 3
    paths = ds.read(0, len(ds), columns=["path"])["path"]
    expected = [(8 + 3 * int(Path(p).stem)) * 8 for p in paths]
    assert read_sample_cost(dst).tolist() == expected
    assert ds.manifest.cost.kind == "pixels"
    assert ds.manifest.cost.buckets == cost_buckets(np.array(expected))
    # re-encoded images are measured after re-encoding
    small = tmp_path / "small"
    args = ["--target-shard-size", "1KB", "--image-format", "jpeg", "--max-image-side", "8"]
    assert main(["convert", str(src), str(small), *args]) == 0
    images = open_dataset(small).read(0, 18, columns=["image"])["image"]
    sizes = [Image.open(io.BytesIO(blob)).size for blob in images]
    assert max(max(size) for size in sizes) == 8
    assert read_sample_cost(small).tolist() == [w * h for w, h in sizes]


def test_convert_refuses_an_impossible_cost_kind_before_publishing(tmp_path, capsys):
    src = jsonl_corpus(tmp_path / "src", n=40)
    dst = tmp_path / "dst"
    assert main(["convert", str(src), str(dst), "--cost", "pixels"]) == 1
    assert "cost='pixels' needs a 'image' feature" in capsys.readouterr().err
    assert not (dst / MANIFEST_PATH).exists()
    with pytest.raises(SystemExit):
        main(["convert", str(src), str(dst), "--cost", "flops"])


# --------------------------------------------------------------------------------------------
# the shard outcome's state, and reading the column


def test_outcome_state_round_trips_row_cost(tmp_path):
    outcome = an_outcome(tmp_path)  # text "y" * (i % 11) and a float32 x 3 tensor: tokens
    assert outcome.row_cost.tolist() == [expected_tokens("y" * (i % 11)) for i in range(50)]
    state = json.loads(json.dumps(outcome.to_state()))
    assert set(state["row_cost"]) == {"dtype", "zstd_b64"}
    back = ShardOutcome.from_state(state)
    assert back.row_cost.dtype == np.int64
    np.testing.assert_array_equal(back.row_cost, outcome.row_cost)
    np.testing.assert_array_equal(back.row_bytes, outcome.row_bytes)
    wide = dataclasses.replace(outcome, row_cost=np.full(50, 2**33))
    state = json.loads(json.dumps(wide.to_state()))
    assert state["row_cost"]["dtype"] == "uint64"
    assert ShardOutcome.from_state(state).row_cost.tolist() == [2**33] * 50


def test_outcome_without_or_with_bad_row_cost_is_refused_and_not_reused(tmp_path):
    outcome = an_outcome(tmp_path)
    old = {k: v for k, v in outcome.to_state().items() if k != "row_cost"}
    with pytest.raises(ShardfeedError, match=r"shard 3: .*no row_cost.*older shardfeed"):
        ShardOutcome.from_state(old)
    garbage = outcome.to_state() | {"row_cost": {"dtype": "uint32", "zstd_b64": "bm90IHpzdGQ="}}
    with pytest.raises(ShardfeedError, match="shard 3: unreadable row_cost"):
        ShardOutcome.from_state(garbage)
    with pytest.raises(ShardfeedError, match="49 row costs for 50 rows"):
        dataclasses.replace(outcome, row_cost=outcome.row_cost[:49])
    sidecar = tmp_path / "sidecar.json"
    sidecar.write_text(json.dumps({"inputs": "abc", "outcome": outcome.to_state()}))
    assert reusable_outcome(StorePath(str(tmp_path)), StorePath(str(sidecar)), "abc") is not None
    sidecar.write_text(json.dumps({"inputs": "abc", "outcome": old}))
    assert reusable_outcome(StorePath(str(tmp_path)), StorePath(str(sidecar)), "abc") is None


def test_write_sample_index_cost_column(tmp_path):
    record = write_sample_index(
        str(tmp_path / "a"), [np.array([1, 2]), np.array([3])], cost=[np.array([5, 2**32]), [0]]
    )
    table = pq.read_table(tmp_path / "a" / SAMPLE_INDEX_PATH)
    assert table.schema.field("bytes").type == pa.uint32()  # each column is as narrow as it can be
    assert table.schema.field("cost").type == pa.uint64()
    assert table.column("cost").to_pylist() == [5, 2**32, 0]
    assert record.bytes == (tmp_path / "a" / SAMPLE_INDEX_PATH).stat().st_size
    with pytest.raises(ValueError, match="per-shard lengths differ"):
        write_sample_index(str(tmp_path / "b"), [np.array([1, 2])], cost=[np.array([1])])
    with pytest.raises(ValueError, match="sample costs must be >= 0"):
        write_sample_index(str(tmp_path / "c"), [np.array([1])], cost=[np.array([-1])])
    # the same values cut differently into shards give the same bytes
    write_sample_index(str(tmp_path / "d"), [np.array([1, 2, 3])], cost=[np.array([5, 2**32, 0])])
    same = (tmp_path / "d" / SAMPLE_INDEX_PATH).read_bytes()
    assert same == (tmp_path / "a" / SAMPLE_INDEX_PATH).read_bytes()


def test_a_dataset_from_before_costs_says_to_reconvert(small_dataset):
    root, manifest, _ = small_dataset
    sizes = read_sample_bytes(root)
    # the older layout: a bytes-only index and no manifest cost
    record = write_sample_index(str(root), [sizes])
    files = tuple(record if f.path == SAMPLE_INDEX_PATH else f for f in manifest.files)
    old = dataclasses.replace(manifest, files=files, cost=None)
    content = old.provenance.content_options  # the fingerprint its writer would have given it
    fingerprint = compute_fingerprint([s.sha256 for s in old.shards], content, files)
    old = dataclasses.replace(old, fingerprint=fingerprint)
    (root / MANIFEST_PATH).write_text(old.dumps())
    with pytest.raises(SampleCostMissingError, match=r"records no per-sample cost.*re-run"):
        read_sample_cost(root)
    np.testing.assert_array_equal(read_sample_bytes(root), sizes)  # sizes still read
    assert verify_dataset(root).ok
    # a manifest that promises a cost the index does not hold is an error, not "missing"
    (root / MANIFEST_PATH).write_text(dataclasses.replace(old, cost=manifest.cost).dumps())
    with pytest.raises(SampleIndexError, match="no column 'cost'") as err:
        read_sample_cost(root)
    assert not isinstance(err.value, SampleCostMissingError)
