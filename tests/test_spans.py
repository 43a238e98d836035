"""The span primitives the planners build on, against brute-force row lists."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from shardfeed.planning.spans import (
    RowBytes,
    Spans,
    cut_at,
    from_global,
    merge_adjacent,
    refine,
    row_group_runs,
    split_near,
    split_rows,
    subtract,
    union,
)
from shardfeed.planning.stable_random import permutation, random_keys

OFFSETS = np.array([0, 5, 5, 17, 30])  # four shards of 5, 0, 12 and 13 rows


def rows_of(spans: Spans) -> list[tuple[int, int]]:
    return [
        (int(s), r)
        for s, a, b in zip(spans.shard, spans.start, spans.end, strict=True)
        for r in range(a, b)
    ]


span_lists = st.lists(
    st.sampled_from(
        [(0, 0, 5), (0, 1, 3), (2, 0, 12), (2, 4, 9), (3, 2, 13), (3, 0, 1), (1, 0, 0)]
    ),
    max_size=8,
).map(lambda items: Spans(*(np.array([i[k] for i in items], dtype=np.int64) for k in range(3))))


@given(spans=span_lists, data=st.data())
def test_refine_cuts_a_sequence_exactly(spans, data):
    total = spans.total_rows
    cuts = sorted(data.draw(st.lists(st.integers(0, total), min_size=1, max_size=6)))
    pieces, part, source = refine(spans, np.array(cuts))
    flat = rows_of(spans)
    assert rows_of(pieces) == flat[cuts[0] : cuts[-1]]
    positions = np.concatenate([[0], np.cumsum(pieces.rows)])[:-1] + cuts[0]
    for pos, p, src in zip(positions, part, source, strict=True):
        assert cuts[p] <= pos < cuts[p + 1]
        assert flat[pos][0] == spans.shard[src]
    assert np.all(pieces.rows > 0)


@given(spans=span_lists, size=st.integers(1, 6))
def test_split_rows_keeps_rows_in_order(spans, size):
    pieces, source = split_rows(spans, size)
    assert rows_of(pieces) == rows_of(spans)
    assert np.all(pieces.rows <= size) and np.all(pieces.rows > 0)
    assert np.all(pieces.shard == spans.shard[source])


@given(spans=span_lists, boundaries=st.lists(st.integers(0, 30), max_size=10))
def test_cut_at_splits_exactly_at_the_boundaries_inside_each_span(spans, boundaries):
    boundaries = np.unique(boundaries)
    pieces, source = cut_at(spans, boundaries, OFFSETS)
    assert rows_of(pieces) == rows_of(spans)
    assert np.all(pieces.shard == spans.shard[source])
    assert np.all(np.diff(source) >= 0) and np.all(pieces.rows >= 0)
    a, b = pieces.to_global(OFFSETS)
    for lo, hi in zip(a.tolist(), b.tolist(), strict=True):
        assert not np.any((boundaries > lo) & (boundaries < hi))  # no boundary inside a piece
    starts = np.diff(source, prepend=-1) != 0
    assert np.isin(a[~starts], boundaries).all()  # and every cut is at one


@given(spans=span_lists, size=st.integers(1, 6))
def test_split_near_makes_near_equal_pieces_of_about_size(spans, size):
    pieces, source = split_near(spans, size)
    assert rows_of(pieces) == rows_of(spans)
    assert np.all(pieces.rows > 0) and np.all(2 * pieces.rows < 3 * size + 2)
    for i in range(len(spans)):
        mine = pieces.rows[source == i]
        assert len(mine) == (max(1, round(spans.rows[i] / size + 1e-9)) if spans.rows[i] else 0)
        assert len(mine) == 0 or mine.max() - mine.min() <= 1


@given(spans=span_lists, data=st.data())
def test_row_group_runs_counts_runs_of_one_group_per_part(spans, data):
    groups = np.unique([0, 30, *data.draw(st.lists(st.integers(1, 29), max_size=8))])
    part = np.array(
        data.draw(st.lists(st.integers(0, 2), min_size=len(spans), max_size=len(spans)))
    )
    runs, touched = row_group_runs(spans, part, groups, OFFSETS)
    rows = [
        (p, OFFSETS[s] + r)
        for p, (s, a, b) in zip(
            part, zip(spans.shard, spans.start, spans.end, strict=True), strict=True
        )
        for r in range(a, b)
    ]
    keys = [(p, int(np.searchsorted(groups, g, side="right")) - 1) for p, g in rows]
    assert runs == sum(1 for i, k in enumerate(keys) if i == 0 or k != keys[i - 1])
    assert touched == len({g for _, g in keys})


def test_merge_adjacent_joins_only_touching_runs_of_one_group():
    spans = Spans([0, 0, 0, 2, 2], [0, 2, 4, 0, 3], [2, 4, 5, 3, 6])
    merged, group = merge_adjacent(spans, np.array([7, 7, 8, 8, 8]))
    assert list(zip(merged.shard, merged.start, merged.end, strict=True)) == [
        (0, 0, 4),
        (0, 4, 5),
        (2, 0, 6),
    ]
    assert group.tolist() == [7, 8, 8]


intervals = st.lists(st.tuples(st.integers(0, 30), st.integers(0, 30)), max_size=8).map(
    lambda pairs: (
        np.array([min(p) for p in pairs], dtype=np.int64),
        np.array([max(p) for p in pairs], dtype=np.int64),
    )
)


def cover(a: np.ndarray, b: np.ndarray) -> set[int]:
    return {x for lo, hi in zip(a.tolist(), b.tolist(), strict=True) for x in range(lo, hi)}


@given(first=intervals, second=intervals)
def test_union_and_subtract_match_sets(first, second):
    a, b = union(*first)
    assert cover(a, b) == cover(*first)
    assert np.all(a[1:] > b[:-1])  # disjoint and not touching
    c, d = subtract(*first, *second)
    assert cover(c, d) == cover(*first) - cover(*second)


@given(pairs=intervals)
def test_from_global_splits_at_shard_boundaries(pairs):
    a, b = union(*pairs)
    spans = from_global(a, b, OFFSETS)
    ids = [OFFSETS[s] + r for s, r in rows_of(spans)]
    assert ids == sorted(cover(a, b))
    assert np.all(spans.end <= np.diff(OFFSETS)[spans.shard])


def test_row_bytes_are_exact_sums():
    sizes = np.arange(30, dtype=np.int64) * 3 + 1
    row_bytes = RowBytes.from_sizes(sizes, np.diff(OFFSETS))
    spans = Spans([0, 2, 3], [1, 0, 12], [4, 12, 13])
    expected = [sizes[1:4].sum(), sizes[5:17].sum(), sizes[29:30].sum()]
    assert row_bytes.of(spans).tolist() == expected


MASK = (1 << 64) - 1


def reference_keys(seed: tuple[int, ...], ids: list[int]) -> list[int]:
    """splitmix64 as written in the algorithm's description, with Python integers."""

    def mix(x: int) -> int:
        x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK
        return x ^ (x >> 31)

    state = 0
    for word in seed:
        state = mix(((state ^ (word & MASK)) + 0x9E3779B97F4A7C15) & MASK)
    return [mix(((state ^ (i & MASK)) + 0x9E3779B97F4A7C15) & MASK) for i in ids]


def test_stable_random_matches_a_plain_python_splitmix64():
    ids = [0, 1, 2, 12345, 2**40 + 7, -1]
    assert random_keys((3, 9), np.array(ids)).tolist() == reference_keys((3, 9), ids)
    # a pin: plans must stay byte-identical across numpy versions and machines
    assert permutation(8, (42,)).tolist() == [7, 4, 0, 2, 6, 5, 1, 3]
    assert sorted(permutation(1000, (1, 2)).tolist()) == list(range(1000))
    assert permutation(50, (1,)).tolist() != permutation(50, (2,)).tolist()
