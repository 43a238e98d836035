"""Stats accumulators merge exactly and deterministically; payload bytes follow the manifest definition."""

from __future__ import annotations

import itertools

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardfeed.formats.payload import column_row_bytes, table_row_bytes
from shardfeed.formats.stats import FeatureStats, merge_all, sketch_size_for


@settings(max_examples=50, deadline=None)
@given(
    rows=st.integers(1, 400),
    width=st.integers(1, 5),
    splits=st.lists(st.integers(1, 399), max_size=6),
    seed=st.integers(0, 2**16),
)
def test_merged_stats_equal_one_pass(rows, width, splits, seed):
    values = np.random.default_rng(seed).normal(size=(rows, width))
    cuts = sorted({0, rows, *(s for s in splits if s < rows)})
    parts = [{"x": FeatureStats((width,)).add(values[a:b])} for a, b in itertools.pairwise(cuts)]
    merged = merge_all(parts)["x"].to_json()
    assert merged["count"] == [rows]
    np.testing.assert_allclose(merged["mean"], values.mean(axis=0), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(merged["std"], values.std(axis=0), rtol=1e-7, atol=1e-12)
    np.testing.assert_array_equal(merged["min"], values.min(axis=0))
    np.testing.assert_array_equal(merged["max"], values.max(axis=0))
    # below the sketch size quantiles are exact (inverted-CDF definition)
    for key, q in {"q01": 0.01, "q50": 0.5, "q99": 0.99}.items():
        np.testing.assert_array_equal(
            merged[key], np.quantile(values, q, axis=0, method="inverted_cdf")
        )


def test_same_merge_order_gives_identical_results():
    values = np.random.default_rng(1).normal(size=(50_000, 2))

    def build():
        return merge_all(
            [
                {"x": FeatureStats((2,)).add(values[i : i + 3000])}
                for i in range(0, len(values), 3000)
            ]
        )["x"].to_json()

    assert build() == build()


def test_quantile_sketch_error_is_small_beyond_the_sketch():
    values = np.random.default_rng(2).normal(size=(200_000, 1))
    stats = FeatureStats((1,))
    for i in range(0, len(values), 5000):
        stats.add(values[i : i + 5000])
    sorted_values = np.sort(values[:, 0])
    for q in (0.01, 0.1, 0.5, 0.9, 0.99):
        got = stats.quantile(q)[0]
        rank = np.searchsorted(sorted_values, got) / len(sorted_values)
        assert abs(rank - q) < 0.005, (q, rank)


def test_integer_features_keep_integer_min_max_and_shape():
    stats = FeatureStats((2, 2), integer=True).add(np.arange(40).reshape(10, 2, 2))
    out = stats.to_json()
    assert out["min"] == [[0, 1], [2, 3]] and out["max"] == [[36, 37], [38, 39]]
    assert all(isinstance(v, int) for row in out["min"] for v in row)
    assert out["count"] == [10]


def test_sketch_memory_is_bounded_for_wide_tensors():
    assert sketch_size_for(19) == 2048
    assert sketch_size_for(3 * 224 * 224) == 64
    assert sketch_size_for(27648) * 27648 <= 1 << 22


def test_no_values_is_an_error():
    with pytest.raises(ValueError):
        FeatureStats((1,)).to_json()


def test_payload_bytes_follow_the_definition():
    table = pa.table(
        {
            "s": pa.array(["", "ab", None, "héllo"]),  # utf-8 byte lengths: 0 2 0 6
            "t": pa.FixedSizeListArray.from_arrays(
                pa.array(np.zeros(12, np.float32)), 3
            ),  # 3 x 4 bytes
            "i": pa.array([1, None, 3, 4], pa.int16()),  # 2 bytes, null counts 0
            "b": pa.array([True, False, True, None]),  # numpy itemsize 1
            "img": pa.array(
                [
                    {"bytes": b"abc", "path": None},
                    {"bytes": b"", "path": "p"},
                    None,
                    {"bytes": b"x" * 10, "path": ""},
                ],
                pa.struct([("bytes", pa.binary()), ("path", pa.string())]),
            ),
        }
    )
    np.testing.assert_array_equal(column_row_bytes(table.column("s")), [0, 2, 0, 6])
    np.testing.assert_array_equal(column_row_bytes(table.column("t")), [12, 12, 12, 12])
    np.testing.assert_array_equal(column_row_bytes(table.column("i")), [2, 0, 2, 2])
    np.testing.assert_array_equal(column_row_bytes(table.column("b")), [1, 1, 1, 0])
    np.testing.assert_array_equal(column_row_bytes(table.column("img")), [3, 1, 0, 10])
    np.testing.assert_array_equal(table_row_bytes(table), [18, 16, 15, 30])
    # a sliced, multi-chunk column counts only its own rows
    chunked = pa.chunked_array([pa.array(["aaaa", "b"]), pa.array(["cc"])])
    np.testing.assert_array_equal(column_row_bytes(chunked), [4, 1, 2])
    np.testing.assert_array_equal(column_row_bytes(pa.array(["aaaa", "b", "cc"]).slice(1)), [1, 2])


def test_a_failing_disk_write_fails_the_shard_and_leaves_no_file(tmp_path, monkeypatch):
    import shardfeed.formats.shard_writer as shard_writer
    from shardfeed.schemas.features import Feature, FeatureSpec

    spec = FeatureSpec((Feature("x", "float32", (4,)),))
    table = pa.table({"x": pa.array([[1.0, 2.0, 3.0, 4.0]] * 1000, pa.list_(pa.float32(), 4))})

    class FullDisk:
        def __init__(self, raw):
            self.raw = raw

        def write(self, data):
            raise OSError(28, "No space left on device")

        def __getattr__(self, name):
            return getattr(self.raw, name)

    real_open = shard_writer.atomic_open

    def failing_open(path, **options):
        class Ctx:
            def __enter__(self):
                self.inner = real_open(path, **options)
                return FullDisk(self.inner.__enter__())

            def __exit__(self, *exc):
                return self.inner.__exit__(*exc)

        return Ctx()

    monkeypatch.setattr(shard_writer, "atomic_open", failing_open)
    with pytest.raises(OSError, match="No space left"):
        shard_writer.write_shard(tmp_path, "data/s.parquet", table, spec, index_start=0)
    assert [p.name for p in tmp_path.rglob("*") if p.is_file()] == []
