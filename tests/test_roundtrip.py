"""Write then read: every dtype and shape comes back bit-exact through every read path.

Also: byte-identical output for identical input (however the input is chunked), ``locate`` against a
brute-force map, and episodic datasets (episodes never split, ``meta/episodes`` ranges, ``index`` checks).
"""

from __future__ import annotations

import json
import shutil
import tempfile

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from shardfeed import open_dataset, write_dataset
from shardfeed.formats.columns import to_table
from shardfeed.formats.errors import IncompleteDatasetError
from shardfeed.schemas import Feature, FeatureSpec, ShardfeedError
from shardfeed.schemas.features import NUMERIC_DTYPES

SHAPES = [(1,), (3,), (2, 3)]
KINDS = [*NUMERIC_DTYPES, "string", "image"]
_UINT_VIEW = {2: np.uint16, 4: np.uint32, 8: np.uint64}

# --------------------------------------------------------------------------------------------
# helpers


def _expected_array(feature: Feature, values) -> np.ndarray:
    """What the reader must return for ``values``: (N,) for scalars, (N, *shape) for tensors."""
    if feature.dtype in ("string", "image"):
        out = np.empty(len(values), dtype=object)
        out[:] = list(values)
        return out
    arr = np.asarray(values, dtype=feature.dtype)
    n = arr.shape[0]
    return arr.reshape((n,) if feature.is_scalar else (n, *feature.shape))


def assert_column_equal(feature: Feature, got: np.ndarray, expected: np.ndarray) -> None:
    """Exact equality: dtype, shape and bits (so -0.0 vs 0.0 and NaN payloads count)."""
    assert isinstance(got, np.ndarray), (feature.name, type(got))
    assert got.shape == expected.shape, (feature.name, got.shape, expected.shape)
    if feature.dtype in ("string", "image"):
        assert got.dtype == object, feature.name
        kind = str if feature.dtype == "string" else bytes
        assert all(type(v) is kind for v in got), feature.name
        assert got.tolist() == expected.tolist(), feature.name
        return
    assert got.dtype == np.dtype(feature.dtype), (feature.name, got.dtype)
    if got.dtype.kind == "f":
        assert np.array_equal(got, expected, equal_nan=True), feature.name
        view = _UINT_VIEW[got.dtype.itemsize]
        assert np.array_equal(
            np.ascontiguousarray(got).view(view), np.ascontiguousarray(expected).view(view)
        ), f"{feature.name}: float bits differ (sign of zero or NaN payload)"
    else:
        assert np.array_equal(got, expected), feature.name


def assert_batch_equal(spec: FeatureSpec, got: dict, expected: dict, names=None) -> None:
    names = list(names) if names is not None else [f.name for f in spec.stored]
    assert list(got) == names
    for name in names:
        assert_column_equal(spec[name], got[name], expected[name])


def assert_row_equal(feature: Feature, got, expected) -> None:
    """``ds[i][name]``: a str/bytes, a numpy scalar, or an array of the feature's shape."""
    if feature.dtype in ("string", "image"):
        assert type(got) is (str if feature.dtype == "string" else bytes)
        assert got == expected
        return
    got = np.asarray(got)
    assert got.dtype == np.dtype(feature.dtype)
    assert got.shape == (() if feature.is_scalar else tuple(feature.shape))
    assert_column_equal(feature, got[None], np.asarray(expected)[None])


def _payload_bytes(spec: FeatureSpec, data: dict, n: int) -> int:
    total = 0
    for feat in spec.stored:
        if feat.dtype == "string":
            total += sum(len(s.encode()) for s in data[feat.name])
        elif feat.dtype == "image":
            total += sum(len(b) for b in data[feat.name])
        else:
            total += n * feat.num_elements * np.dtype(feat.dtype).itemsize
    return total


# --------------------------------------------------------------------------------------------
# strategies


@st.composite
def columns(draw, name: str, n: int):
    kind = draw(st.sampled_from(KINDS))
    if kind == "string":
        values = draw(st.lists(st.text(max_size=6), min_size=n, max_size=n))
        return Feature(name, "string"), values
    if kind == "image":
        values = draw(st.lists(st.binary(max_size=12), min_size=n, max_size=n))
        return Feature(name, "image", (4, 4, 3)), values
    shape = draw(st.sampled_from(SHAPES))
    array_shape = (n,) if shape == (1,) else (n, *shape)
    values = draw(hnp.arrays(np.dtype(kind), array_shape))
    return Feature(name, kind, shape), values


@st.composite
def datasets(draw):
    n = draw(st.integers(min_value=1, max_value=300))
    k = draw(st.integers(min_value=1, max_value=4))
    pairs = [draw(columns(f"f{i}.{'x' * i}", n)) for i in range(k)]
    spec = FeatureSpec(tuple(f for f, _ in pairs))
    data = {f.name: v for f, v in pairs}
    return spec, data, n


# --------------------------------------------------------------------------------------------
# the property


@settings(
    max_examples=50,
    deadline=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)
@given(
    dataset=datasets(),
    # n == 1 and zero-payload data still give one shard; otherwise aim for several
    shards_wanted=st.integers(min_value=2, max_value=8),
    groups_wanted=st.integers(min_value=2, max_value=4),
    draws=st.data(),
)
def test_write_read_round_trip(dataset, shards_wanted, groups_wanted, draws):
    spec, data, n = dataset
    payload = _payload_bytes(spec, data, n)
    target = max(1, payload // shards_wanted)
    row_group = max(1, target // groups_wanted)
    expected = {f.name: _expected_array(f, data[f.name]) for f in spec}
    root = tempfile.mkdtemp(prefix="sf-roundtrip-")
    try:
        manifest = write_dataset(
            root, spec, data, target_shard_size=target, row_group_size=row_group
        )
        assert manifest.num_samples == n
        assert sum(s.rows for s in manifest.shards) == n
        ds = open_dataset(root)
        assert len(ds) == n

        # everything
        assert_batch_equal(spec, ds.read(0, n), expected)

        # single rows, including negative indices
        for i in draws.draw(st.lists(st.integers(0, n - 1), max_size=6), label="rows"):
            row = ds[i]
            assert list(row) == spec.names
            for feat in spec:
                assert_row_equal(feat, row[feat.name], expected[feat.name][i])
        last = ds[-1]
        for feat in spec:
            assert_row_equal(feat, last[feat.name], expected[feat.name][n - 1])

        # ranges, across shard and row-group boundaries
        a = draws.draw(st.integers(0, n), label="a")
        b = draws.draw(st.integers(a, n), label="b")
        assert_batch_equal(spec, ds.read(a, b), {k: v[a:b] for k, v in expected.items()})

        # a column subset, in the caller's order
        subset = draws.draw(
            st.lists(st.sampled_from(spec.names), min_size=1, unique=True), label="columns"
        )
        assert_batch_equal(
            spec, ds.read(a, b, columns=subset), {k: v[a:b] for k, v in expected.items()}, subset
        )

        # take: any order, repeats, across shards
        idx = draws.draw(st.lists(st.integers(0, n - 1), max_size=40), label="take")
        got = ds.take(idx)
        assert_batch_equal(
            spec, got, {k: v[np.asarray(idx, dtype=np.int64)] for k, v in expected.items()}
        )
        got = ds.take(np.asarray(idx, dtype=np.int64), columns=subset)
        assert_batch_equal(
            spec, got, {k: v[np.asarray(idx, dtype=np.int64)] for k, v in expected.items()}, subset
        )

        # iter_batches covers everything once, in order
        batch_size = draws.draw(st.integers(1, n), label="batch_size")
        seen = 0
        for batch in ds.iter_batches(batch_size):
            size = len(batch[spec.names[0]])
            assert_batch_equal(spec, batch, {k: v[seen : seen + size] for k, v in expected.items()})
            seen += size
        assert seen == n
        ds.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _extremes(dtype: str, count: int, rng: np.random.Generator) -> np.ndarray:
    """``count`` values of ``dtype`` that start with its awkward corners, then random ones."""
    dt = np.dtype(dtype)
    if dt.kind == "b":
        return rng.integers(0, 2, count).astype(bool)
    if dt.kind in "iu":
        info = np.iinfo(dt)
        corners = np.array([info.min, info.max, 0, 1, info.max - 1], dtype=dt)
        rand = rng.integers(info.min, info.max, count, dtype=dt, endpoint=True)
    else:
        info = np.finfo(dt)
        corners = np.array(
            [
                np.nan,
                -0.0,
                0.0,
                np.inf,
                -np.inf,
                info.max,
                info.min,
                info.tiny,
                info.smallest_subnormal,
            ],
            dtype=dt,
        )
        rand = (rng.standard_normal(count) * 100).astype(dt)
    out = rand.copy()
    out[: min(count, len(corners))] = corners[:count]
    return out


def test_every_dtype_and_shape_round_trips(tmp_path):
    rng = np.random.default_rng(7)
    n = 97
    features, data = [], {}
    for dtype in NUMERIC_DTYPES:
        for shape in SHAPES:
            name = f"{dtype}.{'x'.join(map(str, shape))}"
            size = int(np.prod(shape))
            values = _extremes(dtype, n * size, rng)
            features.append(Feature(name, dtype, shape))
            data[name] = values.reshape((n,) if shape == (1,) else (n, *shape))
    features += [Feature("text", "string"), Feature("img", "image", (2, 2, 3))]
    data["text"] = [
        "",
        "\u00e9",
        "\U0001f916 robot",
        "a\x00b",
        *[f"t{i}" * (i % 4) for i in range(n - 4)],
    ]
    data["img"] = [b"", b"\x00", bytes(range(256)), *[bytes([i]) * (i % 9) for i in range(n - 3)]]
    spec = FeatureSpec(tuple(features))
    manifest = write_dataset(
        tmp_path / "ds", spec, data, target_shard_size=6000, row_group_size=1500
    )
    assert len(manifest.shards) >= 3
    assert all(len(s.row_groups) >= 2 for s in manifest.shards)
    ds = open_dataset(tmp_path / "ds")
    expected = {f.name: _expected_array(f, data[f.name]) for f in spec}
    assert_batch_equal(spec, ds.read(0, n), expected)
    idx = rng.integers(0, n, 200)
    assert_batch_equal(spec, ds.take(idx), {k: v[idx] for k, v in expected.items()})
    for i in (0, 1, 5, n // 2, n - 1):
        row = ds[i]
        for feat in spec:
            assert_row_equal(feat, row[feat.name], expected[feat.name][i])
    # the stored Arrow types are exactly the spec's (no silent widening)
    for shard in manifest.shards:
        schema = pq.read_schema(tmp_path / "ds" / shard.path).remove_metadata()
        assert schema.equals(spec.arrow_schema()), shard.path


def test_small_targets_really_give_several_shards_and_row_groups(small_dataset):
    root, manifest, data = small_dataset
    assert len(manifest.shards) >= 3
    assert sum(len(s.row_groups) for s in manifest.shards) >= 6
    ds = open_dataset(root)
    for shard in manifest.shards:
        footer = pq.ParquetFile(root / shard.path).metadata
        assert footer.num_rows == shard.rows
        assert (
            tuple(footer.row_group(i).num_rows for i in range(footer.num_row_groups))
            == shard.row_groups
        )
    batch = ds.read(0, len(ds))
    np.testing.assert_array_equal(batch["label"], data["label"])
    assert batch["caption"].tolist() == data["caption"]


def test_empty_reads_keep_dtype_and_shape(small_dataset):
    root, _, _ = small_dataset
    ds = open_dataset(root)
    for a, b in [(5, 5), (9, 3), (len(ds), len(ds) + 10)]:
        out = ds.read(a, b)
        assert out["observation.state"].shape == (0, 3)
        assert out["observation.state"].dtype == np.float32
        assert out["label"].shape == (0,) and out["label"].dtype == np.int64
        assert out["caption"].shape == (0,) and out["image"].shape == (0,)
    out = ds.take([])
    assert out["observation.state"].shape == (0, 3)


def test_out_of_range_access_raises(small_dataset):
    root, _, _ = small_dataset
    ds = open_dataset(root)
    n = len(ds)
    with pytest.raises(IndexError):
        ds[n]
    with pytest.raises(IndexError):
        ds.take([0, n])
    with pytest.raises(IndexError):
        ds.take([-n - 1])
    with pytest.raises(IndexError):
        ds.locate(n)
    with pytest.raises(IndexError):
        ds.locate(-1)
    with pytest.raises(KeyError):
        ds.read(0, 1, columns=["nope"])


def test_take_with_negative_indices(small_dataset):
    root, _, data = small_dataset
    ds = open_dataset(root)
    n = len(ds)
    got = ds.take([-1, 0, -n, 5])
    np.testing.assert_array_equal(got["label"], data["label"][[n - 1, 0, 0, 5]])


# --------------------------------------------------------------------------------------------
# determinism


def _episodic_spec() -> FeatureSpec:
    return FeatureSpec(
        (
            Feature("observation.state", "float32", (2,)),
            Feature("action", "float32", (2,)),
            Feature("timestamp", "float32"),
            Feature("frame_index", "int64"),
            Feature("episode_index", "int64"),
            Feature("index", "int64"),
            Feature("task_index", "int64"),
        )
    )


EPISODE_LENGTHS = [5, 17, 3, 30, 8, 12, 1, 20, 9, 15]
TASKS = ["pick the cube", "place the cube", "push the button"]


def _episodic_data(lengths=EPISODE_LENGTHS, seed=0) -> dict:
    rng = np.random.default_rng(seed)
    n = sum(lengths)
    episode = np.repeat(np.arange(len(lengths)), lengths)
    frame = np.concatenate([np.arange(k) for k in lengths])
    return {
        "observation.state": rng.normal(size=(n, 2)).astype(np.float32),
        "action": rng.normal(size=(n, 2)).astype(np.float32),
        "timestamp": (frame / 10).astype(np.float32),
        "frame_index": frame,
        "episode_index": episode,
        "index": np.arange(n),
        "task_index": episode % len(TASKS),
    }


def _write_plain(root, small_spec, data):
    return write_dataset(root, small_spec, data, target_shard_size=900, row_group_size=300)


def _write_episodic(root, data, **kwargs):
    return write_dataset(
        root,
        _episodic_spec(),
        data,
        tasks=TASKS,
        fps=10,
        robot_type="so100",
        target_shard_size=kwargs.pop("target_shard_size", 800),
        row_group_size=kwargs.pop("row_group_size", 200),
        **kwargs,
    )


def test_same_input_gives_byte_identical_datasets(
    tmp_path, small_spec, read_tree, make_small_dataset
):
    _, _, data = make_small_dataset("first")
    _write_plain(tmp_path / "second", small_spec, data)
    a, b = read_tree(tmp_path / "first"), read_tree(tmp_path / "second")
    assert sorted(a) == sorted(b)
    assert {"meta/info.json", "meta/stats.json", "meta/shardfeed/manifest.json"} <= set(a)
    assert sum(p.startswith("data/") for p in a) >= 3
    for rel in a:
        assert a[rel] == b[rel], f"{rel} differs between two identical writes"


def test_episodic_output_is_byte_identical(tmp_path, read_tree):
    data = _episodic_data()
    _write_episodic(tmp_path / "a", data)
    _write_episodic(tmp_path / "b", data)
    a, b = read_tree(tmp_path / "a"), read_tree(tmp_path / "b")
    assert sorted(a) == sorted(b)
    assert {"meta/tasks.parquet", "meta/episodes/chunk-000/file-000.parquet"} <= set(a)
    for rel in a:
        assert a[rel] == b[rel], rel


def test_chunking_of_the_input_does_not_change_bytes(
    tmp_path, small_spec, read_tree, make_small_dataset
):
    _, _, data = make_small_dataset("dict")  # the same rows, given as a dict of columns
    table = to_table(data, small_spec).combine_chunks()
    assert table.column(0).num_chunks == 1
    chunked = pa.Table.from_batches(table.to_batches(max_chunksize=7))
    assert chunked.column(0).num_chunks == 18
    batches = table.to_batches(max_chunksize=7)

    _write_plain(tmp_path / "one", small_spec, table)
    _write_plain(tmp_path / "sevens", small_spec, chunked)
    _write_plain(tmp_path / "batches", small_spec, batches)
    reference = read_tree(tmp_path / "dict")
    for variant in ("one", "sevens", "batches"):
        other = read_tree(tmp_path / variant)
        assert sorted(other) == sorted(reference), variant
        for rel in reference:
            assert other[rel] == reference[rel], f"{variant}: {rel} differs"


def test_episodic_chunking_does_not_change_bytes(tmp_path, read_tree):
    data = _episodic_data()
    table = to_table(data, _episodic_spec())
    _write_episodic(tmp_path / "one", table.combine_chunks())
    _write_episodic(tmp_path / "sevens", pa.Table.from_batches(table.to_batches(max_chunksize=7)))
    a, b = read_tree(tmp_path / "one"), read_tree(tmp_path / "sevens")
    assert sorted(a) == sorted(b)
    for rel in a:
        assert a[rel] == b[rel], rel


def test_content_options_change_the_fingerprint_only(tmp_path, small_spec, make_small_dataset):
    _, m1, data = make_small_dataset("a")
    m2 = write_dataset(
        tmp_path / "b",
        small_spec,
        data,
        target_shard_size=900,
        row_group_size=300,
        content_options={"resize": 224},
    )
    assert [s.sha256 for s in m1.shards] == [s.sha256 for s in m2.shards]
    assert m1.fingerprint != m2.fingerprint


# --------------------------------------------------------------------------------------------
# locate


def test_locate_matches_brute_force(make_small_dataset):
    root, manifest, _ = make_small_dataset(n=250, target_shard_size=1500, row_group_size=170)
    assert len(manifest.shards) >= 3
    expected = []
    for s, shard in enumerate(manifest.shards):
        for g, rows in enumerate(shard.row_groups):
            expected.extend((s, g, r) for r in range(rows))
    ds = open_dataset(root)
    assert len(expected) == len(ds) == 250
    assert [ds.locate(i) for i in range(len(ds))] == expected


def test_locate_uneven_row_groups(tmp_path):
    # payload varies a lot per row, so row groups and shards have very different row counts
    sizes = [1 if i % 10 else 400 for i in range(200)]
    spec = FeatureSpec((Feature("blob", "image"),))
    manifest = write_dataset(
        tmp_path / "ds",
        spec,
        {"blob": [b"x" * k for k in sizes]},
        target_shard_size=3000,
        row_group_size=700,
        cost="bytes",  # the blobs are not images: pixels cannot be measured
    )
    counts = {rows for shard in manifest.shards for rows in shard.row_groups}
    assert len(counts) > 1
    expected = [
        (s, g, r)
        for s, shard in enumerate(manifest.shards)
        for g, rows in enumerate(shard.row_groups)
        for r in range(rows)
    ]
    ds = open_dataset(tmp_path / "ds")
    assert [ds.locate(i) for i in range(len(ds))] == expected
    assert ds.read(0, len(ds))["blob"].tolist() == [b"x" * k for k in sizes]


# --------------------------------------------------------------------------------------------
# episodic datasets


def test_episodes_are_never_split(tmp_path):
    data = _episodic_data()
    n = sum(EPISODE_LENGTHS)
    manifest = _write_episodic(tmp_path / "ds", data)
    assert len(manifest.shards) >= 3
    ds = open_dataset(tmp_path / "ds")
    shard_of_row = np.array([ds.locate(i)[0] for i in range(n)])
    for ep in range(len(EPISODE_LENGTHS)):
        shards = set(shard_of_row[data["episode_index"] == ep].tolist())
        assert len(shards) == 1, f"episode {ep} split across shards {shards}"
    # every shard starts at an episode boundary
    starts = np.r_[0, np.cumsum(EPISODE_LENGTHS)]
    assert all(s.index_start in starts for s in manifest.shards)
    # and the data reads back unchanged
    out = ds.read(0, n)
    for name, values in data.items():
        np.testing.assert_array_equal(out[name], values)

    info = json.loads((tmp_path / "ds" / "meta" / "info.json").read_text())
    assert info["total_episodes"] == len(EPISODE_LENGTHS)
    assert info["total_frames"] == n
    assert info["total_tasks"] == len(TASKS)
    assert info["fps"] == 10
    assert info["splits"] == {"train": f"0:{len(EPISODE_LENGTHS)}"}


def test_episodes_metadata_matches_the_data(tmp_path):
    data = _episodic_data()
    manifest = _write_episodic(tmp_path / "ds", data)
    episodes = pq.read_table(
        tmp_path / "ds" / "meta/episodes/chunk-000/file-000.parquet"
    ).to_pylist()
    assert [e["episode_index"] for e in episodes] == list(range(len(EPISODE_LENGTHS)))
    bounds = np.r_[0, np.cumsum(EPISODE_LENGTHS)].tolist()
    for ep, row in enumerate(episodes):
        assert row["dataset_from_index"] == bounds[ep]
        assert row["dataset_to_index"] == bounds[ep + 1]
        assert row["length"] == EPISODE_LENGTHS[ep]
        assert row["tasks"] == [TASKS[ep % len(TASKS)]]
        # data/chunk_index and data/file_index point at the shard holding the episode
        shard = next(
            i for i, s in enumerate(manifest.shards) if s.index_start <= bounds[ep] < s.index_end
        )
        assert bounds[ep + 1] <= manifest.shards[shard].index_end
        path = f"data/chunk-{row['data/chunk_index']:03d}/file-{row['data/file_index']:03d}.parquet"
        assert path == manifest.shards[shard].path
        # per-episode stats are present and right for a simple column
        assert row["stats/frame_index/min"] == [0]
        assert row["stats/frame_index/max"] == [EPISODE_LENGTHS[ep] - 1]
        assert row["stats/frame_index/count"] == [EPISODE_LENGTHS[ep]]
    tasks = pq.read_table(tmp_path / "ds" / "meta/tasks.parquet")
    assert tasks.column("task_index").to_pylist() == list(range(len(TASKS)))
    assert tasks.column("__index_level_0__").to_pylist() == TASKS


@pytest.mark.parametrize(
    "renumber",
    [
        pytest.param(lambda idx: idx + 1, id="starts-at-1"),
        pytest.param(lambda idx: idx[::-1].copy(), id="reversed"),
        pytest.param(lambda idx: np.where(idx == 50, 51, idx), id="duplicate"),
        pytest.param(lambda idx: idx * 2, id="gaps"),
    ],
)
def test_index_must_run_0_to_n_minus_1(tmp_path, renumber):
    data = _episodic_data()
    data["index"] = renumber(data["index"])
    with pytest.raises(ShardfeedError) as info:
        _write_episodic(tmp_path / "ds", data)
    assert "'index'" in str(info.value) and "0..N-1" in str(info.value)
    # a failed write never looks like a complete dataset
    with pytest.raises(IncompleteDatasetError):
        open_dataset(tmp_path / "ds")


def test_episode_in_two_runs_is_refused(tmp_path):
    data = _episodic_data(lengths=[4, 4, 4])
    data["episode_index"] = np.array([0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0])
    with pytest.raises(ShardfeedError, match="episode 0"):
        _write_episodic(tmp_path / "ds", data, target_shard_size="1MB")


def test_task_index_without_a_task_is_refused(tmp_path):
    data = _episodic_data()
    data["task_index"] = data["task_index"] + len(TASKS)
    with pytest.raises(ShardfeedError, match="task_index"):
        _write_episodic(tmp_path / "ds", data)
