"""``segment_stats``: every episode's stats of a shard at once, equal to a sketch per episode
(``FeatureStats.add`` then ``summary``), without a sketch's quantile pass for each."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

from shardfeed.formats.stats import FeatureStats, merge_all, segment_stats

CASES = [
    ((6,), np.float32, False),
    ((2, 3), np.float64, False),
    ((), np.float32, False),
    ((1,), np.int64, True),
    ((4,), np.uint64, True),
    ((1,), np.bool_, True),
]


def _values(rng: np.random.Generator, n: int, shape: tuple, dtype: type) -> np.ndarray:
    if dtype == np.bool_:
        return rng.random((n, *shape)) > 0.5
    if np.issubdtype(dtype, np.integer):
        return rng.integers(0, 2**40, (n, *shape)).astype(dtype)
    # magnitudes far apart (summation order shows), NaN, inf and ties of 0.0 with -0.0
    values = rng.normal(size=(n, *shape)) * 10 ** rng.uniform(-3, 6, size=(n, *shape))
    values = values.astype(dtype)
    values[7], values[100], values[200:210], values[203:207] = np.nan, np.inf, 0.0, -0.0
    return values


def _dumped(stats) -> str:
    return json.dumps(stats.to_state())


@pytest.mark.parametrize(("shape", "dtype", "integer"), CASES)
def test_each_range_equals_a_sketch_of_its_own(shape, dtype, integer):
    rng = np.random.default_rng(len(shape) + int(integer))
    n = 6000
    values = _values(rng, n, shape, dtype)
    cuts = sorted(rng.choice(np.arange(1, 2500), 25, replace=False).tolist())
    # empty ranges, one longer than a sketch keeps whole (it compacts), the rest short
    edges = [0, 0, *cuts, cuts[-1], n]
    got = segment_stats(values, edges, shape, integer)
    assert len(got) == len(edges) - 1
    for (a, b), (stats, summary) in zip(itertools.pairwise(edges), got, strict=True):
        expected = FeatureStats(shape, integer).add(values[a:b])
        assert _dumped(stats) == _dumped(expected), (a, b)
        assert _dumped(summary) == _dumped(expected.summary()), (a, b)
        assert summary.count == b - a
    # merged in order, they are the sketches' merge
    parts = [{"x": stats} for stats, _ in got]
    alone = [
        {"x": FeatureStats(shape, integer).add(values[a:b])} for a, b in itertools.pairwise(edges)
    ]
    assert _dumped(merge_all(parts)["x"]) == _dumped(merge_all(alone)["x"])


def test_short_ranges_take_no_quantile_pass(monkeypatch):
    """Only a range too long for a sketch to hold whole is summarised by a sketch's quantiles."""
    calls = []
    real = FeatureStats.quantiles

    def counting(self, qs):
        calls.append(self.count)
        return real(self, qs)

    monkeypatch.setattr(FeatureStats, "quantiles", counting)
    values = np.random.default_rng(0).normal(size=(9000, 6)).astype(np.float32)
    edges = [0, *range(100, 4000, 130), 9000]  # 30 short episodes and one of 5,000 frames
    got = segment_stats(values, edges, (6,), False)
    assert len(got) == len(edges) - 1
    assert calls == [9000 - edges[-2]]


def test_no_ranges():
    assert segment_stats(np.zeros((0, 3), np.float32), [0], (3,), False) == []
    ((stats, summary),) = segment_stats(np.zeros((0, 3), np.float32), [0, 0], (3,), False)
    assert stats.count == summary.count == 0 and summary.values is None
