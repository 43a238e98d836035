"""Features, meta/info.json, the manifest, path safety, fingerprints and the contiguous planner."""

from __future__ import annotations

import copy
import itertools
import json

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from shardfeed.planning.partition import contiguous_cuts, num_parts_for
from shardfeed.schemas import (
    IMAGE_ARROW_TYPE,
    Feature,
    FeatureSpec,
    Info,
    Manifest,
    SchemaError,
    ShardfeedError,
    UnsafePathError,
    check_relative_path,
    compute_fingerprint,
    feature_from_arrow,
    resolve_within,
)
from shardfeed.schemas.features import NUMERIC_DTYPES
from shardfeed.schemas.info import INFO_FIELDS
from shardfeed.schemas.manifest import ShardRecord

# --------------------------------------------------------------------------------------------
# Feature / FeatureSpec


@pytest.mark.parametrize("dtype", list(NUMERIC_DTYPES))
def test_shape_one_is_a_scalar_column(dtype):
    feat = Feature("x", dtype, (1,))
    assert feat.is_scalar and not feat.is_tensor and feat.stored
    assert feat.arrow_type == NUMERIC_DTYPES[dtype]
    assert not pa.types.is_fixed_size_list(feat.arrow_type)


def test_default_shape_is_scalar():
    assert Feature("x", "int64").arrow_type == pa.int64()


@pytest.mark.parametrize("shape", [(19,), (2, 3), (1, 1), (4, 1, 2)])
@pytest.mark.parametrize("dtype", ["float32", "uint8", "bool", "float16"])
def test_other_shapes_are_one_fixed_size_list_level_per_dimension(dtype, shape):
    feat = Feature("x", dtype, shape)
    assert feat.is_tensor and not feat.is_scalar
    atype = feat.arrow_type
    for size in shape:  # outermost dimension first, as datasets' Array2D/Array3D nest them
        assert pa.types.is_fixed_size_list(atype) and atype.list_size == size
        atype = atype.value_type
    assert atype == NUMERIC_DTYPES[dtype]


def test_string_image_video_types():
    assert Feature("s", "string").arrow_type == pa.string()
    img = Feature("img", "image", (64, 64, 3))
    assert img.arrow_type == IMAGE_ARROW_TYPE
    assert pa.types.is_struct(img.arrow_type)
    assert img.arrow_type.field("bytes").type == pa.binary()
    assert img.arrow_type.field("path").type == pa.string()
    assert img.stored and not img.is_numeric

    video = Feature("cam", "video", (480, 640, 3))
    assert video.stored is False
    with pytest.raises(SchemaError) as info:
        _ = video.arrow_type
    assert "features.cam" in str(info.value)


def test_video_has_no_column_in_the_arrow_schema():
    spec = FeatureSpec(
        (Feature("a", "float32", (2,)), Feature("cam", "video", (4, 4, 3)), Feature("b", "int8"))
    )
    schema = spec.arrow_schema()
    assert schema.names == ["a", "b"]
    assert [f.name for f in spec.stored] == ["a", "b"]
    assert spec.names == ["a", "cam", "b"]


@pytest.mark.parametrize("dtype", ["float128", "int", "str", "Float32", "", "images"])
def test_bad_dtype_names_the_field(dtype):
    with pytest.raises(SchemaError) as info:
        Feature("joint", dtype)
    assert info.value.field == "features.joint.dtype"
    assert "features.joint.dtype" in str(info.value)


@pytest.mark.parametrize("shape", [(-1,), (3, -2), ("3",), (True,), (2.0,), ()])
def test_bad_shape_names_the_field(shape):
    with pytest.raises(SchemaError) as info:
        Feature("joint", "float32", shape)
    assert info.value.field == "features.joint.shape"
    assert "features.joint.shape" in str(info.value)


@pytest.mark.parametrize(
    ("obj", "field"),
    [
        ({"shape": [3]}, "features.joint.dtype"),
        ({"dtype": "float32"}, "features.joint.shape"),
        ({"dtype": 5, "shape": [3]}, "features.joint.dtype"),
        ({"dtype": "float32", "shape": 3}, "features.joint.shape"),
        ({"dtype": "float32", "shape": ["a"]}, "features.joint.shape"),
        ({"dtype": "float32", "shape": [True]}, "features.joint.shape"),
        ({"dtype": "nope", "shape": [3]}, "features.joint.dtype"),
        ("float32", "features.joint"),
    ],
)
def test_feature_from_json_errors_name_the_field(obj, field):
    with pytest.raises(SchemaError) as info:
        FeatureSpec.from_json({"joint": obj})
    assert field in str(info.value)
    assert info.value.field.startswith(field)


def test_duplicate_feature_names_are_refused():
    with pytest.raises(SchemaError, match="duplicate"):
        FeatureSpec((Feature("a", "int8"), Feature("a", "int16")))


def test_feature_json_round_trip_keeps_extra_keys_and_order():
    obj = {
        "observation.images.top": {
            "dtype": "video",
            "shape": [480, 640, 3],
            "names": ["height", "width", "channels"],
            "info": {"video.fps": 30, "video.codec": "av1"},
        },
        "observation.state": {
            "dtype": "float32",
            "shape": [6],
            "names": ["j0", "j1", "j2", "j3", "j4", "j5"],
        },
        "timestamp": {"dtype": "float32", "shape": [1], "names": None},
    }
    spec = FeatureSpec.of(obj)
    assert spec.names == list(obj)
    assert spec.to_json() == obj
    assert spec["observation.images.top"].extra == {"info": {"video.fps": 30, "video.codec": "av1"}}
    assert "timestamp" in spec and "nope" not in spec
    with pytest.raises(KeyError):
        spec["nope"]


@pytest.mark.parametrize("dtype", list(NUMERIC_DTYPES))
@pytest.mark.parametrize("shape", [(1,), (3,), (2, 3)])
def test_feature_from_arrow_inverts_arrow_type(dtype, shape):
    feat = Feature("x", dtype, shape)
    back = feature_from_arrow("x", feat.arrow_type, shape if len(shape) > 1 else None)
    assert back == feat


def test_feature_from_arrow_refuses_mismatched_shape():
    with pytest.raises(SchemaError) as info:
        feature_from_arrow("x", pa.list_(pa.float32(), 6), (4, 2))
    assert info.value.field == "features.x.shape"


# --------------------------------------------------------------------------------------------
# Info


def _info() -> Info:
    spec = FeatureSpec(
        (
            Feature("observation.state", "float32", (6,), names=[f"j{i}" for i in range(6)]),
            Feature("action", "float32", (6,)),
            Feature("cam", "video", (480, 640, 3), extra={"info": {"video.fps": 30}}),
            Feature("episode_index", "int64"),
        )
    )
    return Info(
        features=spec,
        total_frames=12,
        total_episodes=2,
        total_tasks=1,
        fps=30,
        robot_type="so100",
        splits={"train": "0:2"},
        video_path="videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4",
    )


def test_info_round_trip():
    info = _info()
    obj = info.to_json()
    assert list(obj) == list(INFO_FIELDS)
    assert obj["codebase_version"] == "v3.0"
    assert Info.from_json(obj) == info
    assert Info.from_json(json.loads(info.dumps())) == info
    assert info.dumps().endswith("\n")


@pytest.mark.parametrize(
    "key", ["total_frames", "total_episodes", "features", "codebase_version", "fps"]
)
def test_info_missing_field(key):
    obj = _info().to_json()
    del obj[key]
    with pytest.raises(SchemaError) as info:
        Info.from_json(obj)
    assert info.value.field == key
    assert key in str(info.value) and "missing" in str(info.value)
    assert "meta/info.json" in str(info.value)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("total_frames", "12"),
        ("total_frames", 12.0),
        ("total_frames", True),
        ("total_episodes", None),
        ("total_tasks", [1]),
        ("chunks_size", "1000"),
        ("features", []),
        ("splits", "train"),
        ("fps", "30"),
        ("robot_type", 5),
        ("total_frames", -1),
    ],
)
def test_info_mistyped_field(key, value):
    obj = _info().to_json()
    obj[key] = value
    with pytest.raises(SchemaError) as info:
        Info.from_json(obj)
    assert info.value.field == key
    assert f"'{key}'" in str(info.value)


@pytest.mark.parametrize("version", ["v2.1", "v3.1", "3.0", ""])
def test_info_wrong_codebase_version(version):
    obj = _info().to_json()
    obj["codebase_version"] = version
    with pytest.raises(SchemaError) as info:
        Info.from_json(obj)
    assert info.value.field == "codebase_version"
    assert "v3.0" in str(info.value)


def test_info_nested_feature_error_names_the_feature():
    obj = _info().to_json()
    obj["features"]["action"]["dtype"] = "float99"
    with pytest.raises(SchemaError) as info:
        Info.from_json(obj)
    assert info.value.field == "features.action.dtype"


def test_info_not_an_object():
    with pytest.raises(SchemaError):
        Info.from_json([1, 2])


# --------------------------------------------------------------------------------------------
# Manifest

SHA_A, SHA_B, SHA_C = "a" * 64, "b" * 64, "0123456789abcdef" * 4


def _manifest_obj() -> dict:
    return {
        "format_version": "1.0",
        "encoding": "parquet",
        "num_samples": 7,
        "fingerprint": compute_fingerprint([SHA_A, SHA_B], {"target_shard_size": 100}),
        "shards": [
            {
                "path": "data/chunk-000/file-000.parquet",
                "bytes": 1000,
                "payload_bytes": 400,
                "rows": 3,
                "row_groups": [2, 1],
                "sha256": SHA_A,
                "index_start": 0,
                "index_end": 3,
            },
            {
                "path": "data/chunk-000/file-001.parquet",
                "bytes": 1200,
                "payload_bytes": 500,
                "rows": 4,
                "row_groups": [4],
                "sha256": SHA_B,
                "index_start": 3,
                "index_end": 7,
            },
        ],
        "files": [{"path": "meta/info.json", "bytes": 321, "sha256": SHA_C}],
        "rejects": {"total": 3, "by_reason": {"bad_image": 1, "too_long": 2}},
        "provenance": {
            "source": "s3://bucket/raw",
            "content_options": {"target_shard_size": 100},
            "shardfeed_version": "0.1.0",
        },
    }


def _load(obj) -> Manifest:
    return Manifest.loads(json.dumps(obj))


def _load_error(obj) -> SchemaError:
    with pytest.raises(SchemaError) as info:
        _load(obj)
    assert isinstance(info.value, ShardfeedError)
    assert "Traceback" not in str(info.value)
    return info.value


def test_manifest_round_trip():
    m = _load(_manifest_obj())
    assert m.num_samples == 7 and len(m.shards) == 2 and m.shards[1].row_groups == (4,)
    assert m.to_json() == _manifest_obj()
    text = m.dumps()
    assert Manifest.loads(text) == m
    assert Manifest.loads(text.encode()).dumps() == text
    # one line per shard record: diffable
    assert sum(1 for line in text.splitlines() if '"path": "data/' in line) == 2


def test_manifest_minor_version_bump_is_accepted():
    obj = _manifest_obj()
    obj["format_version"] = "1.7"
    assert _load(obj).format_version == "1.7"


@pytest.mark.parametrize("version", ["2.0", "0.9", "10.0"])
def test_manifest_unknown_major_version_refused(version):
    obj = _manifest_obj()
    obj["format_version"] = version
    err = _load_error(obj)
    assert err.field == "format_version"
    assert "major" in str(err)


@pytest.mark.parametrize("version", ["1", "1.0.0", "v1.0", "one"])
def test_manifest_malformed_version_refused(version):
    obj = _manifest_obj()
    obj["format_version"] = version
    assert _load_error(obj).field == "format_version"


@pytest.mark.parametrize("token", ["NaN", "Infinity", "-Infinity"])
def test_manifest_non_finite_content_option_refused(token):
    text = json.dumps(_manifest_obj()).replace(
        '"target_shard_size": 100', f'"q": [1, {{"x": {token}}}]'
    )
    with pytest.raises(SchemaError) as info:
        Manifest.loads(text)
    assert info.value.field == "provenance.content_options.q[1].x"
    assert "finite" in str(info.value)


def test_manifest_unknown_encoding_refused():
    obj = _manifest_obj()
    obj["encoding"] = "arrow"
    assert _load_error(obj).field == "encoding"


@pytest.mark.parametrize(
    ("path", "field"),
    [
        (("fingerprint",), "fingerprint"),
        (("num_samples",), "num_samples"),
        (("shards",), "shards"),
        (("rejects",), "rejects"),
        (("provenance",), "provenance"),
        (("shards", 0, "sha256"), "shards[0].sha256"),
        (("shards", 1, "rows"), "shards[1].rows"),
        (("files", 0, "bytes"), "files[0].bytes"),
        (("rejects", "by_reason"), "rejects.by_reason"),
        (("provenance", "content_options"), "provenance.content_options"),
    ],
)
def test_manifest_missing_field(path, field):
    obj = _manifest_obj()
    target = obj
    for key in path[:-1]:
        target = target[key]
    del target[path[-1]]
    err = _load_error(obj)
    assert err.field == field
    assert f"'{field}'" in str(err) and "missing" in str(err)
    assert "manifest.json" in str(err)


@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        (("num_samples",), True, "num_samples"),
        (("num_samples",), "7", "num_samples"),
        (("num_samples",), 7.0, "num_samples"),
        (("fingerprint",), 5, "fingerprint"),
        (("shards",), {}, "shards"),
        (("shards", 0, "sha256"), "A" * 64, "shards[0].sha256"),
        (("shards", 0, "sha256"), "a" * 63, "shards[0].sha256"),
        (("shards", 0, "path"), 5, "shards[0].path"),
        (("files", 0, "bytes"), True, "files[0].bytes"),
        (("files", 0, "bytes"), -1, "files[0].bytes"),
        (("rejects", "total"), False, "rejects.total"),
        (("rejects", "by_reason", "too_long"), "2", "rejects.by_reason.too_long"),
        (("provenance", "source"), None, "provenance.source"),
    ],
)
def test_manifest_mistyped_field(path, value, field):
    obj = _manifest_obj()
    target = obj
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    err = _load_error(obj)
    assert err.field == field
    assert f"'{field}'" in str(err)


@pytest.mark.parametrize("key", ["bytes", "payload_bytes", "rows", "index_start", "index_end"])
def test_manifest_mistyped_shard_integer_names_the_exact_field(key):
    obj = _manifest_obj()
    obj["shards"][1][key] = True  # JSON true is not an integer
    err = _load_error(obj)
    # the field path must be exactly shards[1].<key>, not nested twice
    assert err.field == f"shards[1].{key}"
    assert f"field 'shards[1].{key}'" in str(err)


def test_manifest_negative_shard_integer_names_the_exact_field():
    obj = _manifest_obj()
    obj["shards"][0]["payload_bytes"] = -5
    err = _load_error(obj)
    assert err.field == "shards[0].payload_bytes"


def test_manifest_mistyped_row_group_names_the_exact_field():
    obj = _manifest_obj()
    obj["shards"][0]["row_groups"] = [2, True]
    err = _load_error(obj)
    assert err.field == "shards[0].row_groups[1]"


@pytest.mark.parametrize(
    "bad_path",
    [
        "../../etc/passwd",
        "/etc/passwd",
        "data/%2e%2e/x",
        "data/%2E%2E/%2e%2e/x",
        "a\\b",
        "data/../data/x.parquet",
        "./data/x.parquet",
        "data//x.parquet",
        "data/x.parquet/",
        "C:\\data\\x",
        "C:/data/x",
        "data/x\x00.parquet",
        "data/%00x",
        "",
        "..",
    ],
)
def test_manifest_unsafe_shard_paths_refused(bad_path):
    obj = _manifest_obj()
    obj["shards"][0]["path"] = bad_path
    err = _load_error(obj)
    assert isinstance(err, UnsafePathError)
    assert err.field == "shards[0].path"
    assert "shards[0].path" in str(err)


@pytest.mark.parametrize("bad_path", ["../meta/info.json", "/etc/passwd", "meta/%2e%2e/%2e%2e/x"])
def test_manifest_unsafe_file_paths_refused(bad_path):
    obj = _manifest_obj()
    obj["files"][0]["path"] = bad_path
    err = _load_error(obj)
    assert isinstance(err, UnsafePathError)
    assert err.field == "files[0].path"


@pytest.mark.parametrize(
    "good",
    ["data/chunk-000/file-000.parquet", "a", "videos/cam.top/chunk-001/file-002.mp4", "x..y/..z"],
)
def test_safe_relative_paths_accepted(good):
    assert check_relative_path(good, "f") == good


def test_resolve_within(tmp_path):
    root = tmp_path / "root"
    (root / "data").mkdir(parents=True)
    (root / "data" / "x").write_bytes(b"1")
    (tmp_path / "outside").write_bytes(b"2")
    (root / "data" / "link").symlink_to(tmp_path / "outside")
    assert resolve_within(str(root), "data/x", "f") == str((root / "data" / "x").resolve())
    with pytest.raises(UnsafePathError) as info:
        resolve_within(str(root), "data/link", "shards[3].path")
    assert info.value.field == "shards[3].path"


def _shard(obj, i):
    return obj["shards"][i]


def test_manifest_shards_with_a_gap_refused():
    obj = _manifest_obj()
    _shard(obj, 1).update(index_start=4, index_end=8)
    obj["num_samples"] = 8
    err = _load_error(obj)
    assert err.field == "shards[1].index_start"
    assert "tile" in str(err)


def test_manifest_overlapping_shards_refused():
    obj = _manifest_obj()
    _shard(obj, 1).update(index_start=2, index_end=6)
    obj["num_samples"] = 6
    assert _load_error(obj).field == "shards[1].index_start"


def test_manifest_first_shard_must_start_at_zero():
    obj = _manifest_obj()
    _shard(obj, 0).update(index_start=1, index_end=4)
    _shard(obj, 1).update(index_start=4, index_end=8)
    obj["num_samples"] = 8
    assert _load_error(obj).field == "shards[0].index_start"


@pytest.mark.parametrize("num_samples", [6, 8, 0])
def test_manifest_num_samples_must_equal_shard_coverage(num_samples):
    obj = _manifest_obj()
    obj["num_samples"] = num_samples
    assert _load_error(obj).field == "num_samples"


def test_manifest_index_range_must_match_rows():
    obj = _manifest_obj()
    _shard(obj, 1)["index_end"] = 8
    obj["num_samples"] = 8
    assert _load_error(obj).field == "shards[1].index_end"


def test_manifest_row_groups_must_sum_to_rows():
    obj = _manifest_obj()
    _shard(obj, 0)["row_groups"] = [2, 2]
    err = _load_error(obj)
    assert err.field == "shards[0].row_groups"


def test_manifest_duplicate_paths_refused():
    obj = _manifest_obj()
    _shard(obj, 1)["path"] = _shard(obj, 0)["path"]
    assert _load_error(obj).field == "shards[1].path"
    obj = _manifest_obj()
    obj["files"][0]["path"] = _shard(obj, 0)["path"]
    assert _load_error(obj).field == "files[0].path"


def test_manifest_empty_dataset_is_valid():
    obj = _manifest_obj()
    obj["shards"] = []
    obj["num_samples"] = 0
    assert _load(obj).num_samples == 0


@pytest.mark.parametrize(
    "rejects",
    [
        {"total": 4, "by_reason": {"bad_image": 1, "too_long": 2}},
        {"total": 2, "by_reason": {"bad_image": 1, "too_long": 2}},
        {"total": 1, "by_reason": {}},
        {"total": 0, "by_reason": {"x": 1}},
    ],
)
def test_rejects_total_must_equal_sum_of_reasons(rejects):
    obj = _manifest_obj()
    obj["rejects"] = rejects
    err = _load_error(obj)
    assert err.field == "rejects.total"


def test_manifest_not_json_or_not_object():
    with pytest.raises(SchemaError) as info:
        Manifest.loads("{not json")
    assert "JSON" in str(info.value)
    with pytest.raises(SchemaError):
        Manifest.loads("[]")
    with pytest.raises(SchemaError):
        Manifest.loads(b"\xff\xfe")


# --------------------------------------------------------------------------------------------
# fingerprint


def test_fingerprint_is_content_addressed():
    base = compute_fingerprint([SHA_A, SHA_B], {"target_shard_size": 100, "row_group": 5})
    assert base.startswith("sha256:") and len(base) == len("sha256:") + 64
    assert base == compute_fingerprint([SHA_A, SHA_B], {"target_shard_size": 100, "row_group": 5})
    # dict order does not matter, including nested dicts
    assert base == compute_fingerprint([SHA_A, SHA_B], {"row_group": 5, "target_shard_size": 100})
    nested_a = compute_fingerprint([SHA_A], {"o": {"x": 1, "y": [1, 2]}, "p": 2})
    nested_b = compute_fingerprint([SHA_A], {"p": 2, "o": {"y": [1, 2], "x": 1}})
    assert nested_a == nested_b
    # a shard hash, the shard order, or a content option changes it
    assert base != compute_fingerprint([SHA_A, SHA_C], {"target_shard_size": 100, "row_group": 5})
    assert base != compute_fingerprint([SHA_B, SHA_A], {"target_shard_size": 100, "row_group": 5})
    assert base != compute_fingerprint([SHA_A, SHA_B], {"target_shard_size": 101, "row_group": 5})
    assert base != compute_fingerprint([SHA_A, SHA_B], {"target_shard_size": 100})
    assert base != compute_fingerprint(
        [SHA_A, SHA_B, SHA_C], {"target_shard_size": 100, "row_group": 5}
    )
    assert base != compute_fingerprint([SHA_A], {"target_shard_size": 100, "row_group": 5})


@given(
    st.lists(st.text("0123456789abcdef", min_size=64, max_size=64), max_size=5),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=5),
)
def test_fingerprint_ignores_option_order(hashes, options):
    reordered = dict(reversed(list(options.items())))
    assert compute_fingerprint(hashes, options) == compute_fingerprint(hashes, reordered)


# --------------------------------------------------------------------------------------------
# contiguous_cuts


def _parts(sizes, cuts):
    return [sum(sizes[a:b]) for a, b in itertools.pairwise(cuts)]


@given(
    st.lists(st.integers(min_value=0, max_value=1000), min_size=1, max_size=200),
    st.integers(min_value=1, max_value=50),
)
def test_contiguous_cuts_invariants(sizes, num_parts):
    cuts = contiguous_cuts(np.array(sizes, dtype=np.int64), num_parts)
    assert all(isinstance(c, int) for c in cuts)
    assert cuts[0] == 0 and cuts[-1] == len(sizes)
    assert cuts == sorted(cuts)
    # strictly increasing: no empty part
    assert all(b > a for a, b in itertools.pairwise(cuts))
    assert 1 <= len(cuts) - 1 <= num_parts
    parts = _parts(sizes, cuts)
    assert sum(parts) == sum(sizes)
    mean = sum(sizes) / num_parts
    biggest = max(sizes)
    for part in parts:
        assert abs(part - mean) <= biggest + 1e-9, (sizes, num_parts, cuts)


@given(
    st.integers(min_value=1, max_value=100),
    st.integers(min_value=1, max_value=100),
    st.integers(min_value=1, max_value=50),
)
def test_contiguous_cuts_uniform_items_give_exactly_num_parts(size, n, num_parts):
    cuts = contiguous_cuts(np.full(n, size), num_parts)
    assert len(cuts) - 1 == min(n, num_parts)
    lengths = np.diff(cuts)
    assert lengths.max() - lengths.min() <= 1


def test_contiguous_cuts_edge_cases():
    assert contiguous_cuts(np.array([], dtype=np.int64), 3) == [0]
    assert contiguous_cuts(np.array([5]), 4) == [0, 1]
    assert contiguous_cuts(np.array([1, 1, 1, 1]), 2) == [0, 2, 4]
    assert contiguous_cuts(np.array([0, 0, 0]), 2)[-1] == 3
    with pytest.raises(ValueError):
        contiguous_cuts(np.array([1, 2]), 0)


def test_num_parts_for():
    assert num_parts_for(0, 100) == 1
    assert num_parts_for(100, 100) == 1
    assert num_parts_for(149, 100) == 1
    assert num_parts_for(251, 100) == 3
    with pytest.raises(ValueError):
        num_parts_for(10, 0)


def test_manifest_obj_helper_is_not_mutated_between_tests():
    a, b = _manifest_obj(), copy.deepcopy(_manifest_obj())
    assert a == b


def test_shard_record_units_is_optional_for_older_manifests():
    base = {
        "path": "data/chunk-000/file-000.parquet",
        "bytes": 10,
        "payload_bytes": 8,
        "rows": 2,
        "row_groups": [2],
        "sha256": "0" * 64,
        "index_start": 0,
        "index_end": 2,
    }
    old = ShardRecord.from_json(base, "shards[0]")
    assert old.units is None and "units" not in old.to_json()
    new = ShardRecord.from_json({**base, "units": 1}, "shards[0]")
    assert new.units == 1 and new.to_json()["units"] == 1
    with pytest.raises(SchemaError, match="units"):
        ShardRecord.from_json({**base, "units": -1}, "shards[0]")
