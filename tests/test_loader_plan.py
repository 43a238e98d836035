"""The loader's pure planning: read pieces and batches, and the mixture schedule."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardfeed.loader.mixture import WINDOW_DEVIATION, interleave
from shardfeed.loader.reads import GroupIndex, plan_reads
from shardfeed.planning.spans import RowBytes, Spans


@st.composite
def layouts(draw):
    shards = draw(
        st.lists(st.lists(st.integers(1, 9), min_size=1, max_size=4), min_size=1, max_size=5)
    )
    rows = [sum(g) for g in shards]
    spans = []
    for _ in range(draw(st.integers(1, 8))):
        s = draw(st.integers(0, len(shards) - 1))
        a = draw(st.integers(0, rows[s] - 1))
        b = draw(st.integers(a + 1, rows[s]))
        spans.append((s, a, b))
    return shards, spans, draw(st.integers(1, 12))


@given(layouts())
@settings(max_examples=200, deadline=None)
def test_pieces_cover_the_spans_in_order_inside_row_groups(layout):
    shards, spans, batch = layout
    rows = np.array([sum(g) for g in shards])
    sizes = np.arange(1, rows.sum() + 1) % 7 + 1
    row_bytes = RowBytes.from_sizes(sizes, rows)
    span = Spans(*map(np.array, zip(*spans, strict=True)))
    plan = plan_reads(span, GroupIndex.of(shards), row_bytes, batch)
    group_starts = [np.concatenate([[0], np.cumsum(g)]) for g in shards]
    got = [
        (int(s), int(group_starts[s][g] + r))
        for s, g, lo, hi in zip(plan.shard, plan.group, plan.lo, plan.hi, strict=True)
        for r in range(lo, hi)
    ]
    want = [(s, r) for s, a, b in spans for r in range(a, b)]
    assert got == want
    for s, g, lo, hi in zip(plan.shard, plan.group, plan.lo, plan.hi, strict=True):
        assert 0 <= lo < hi <= shards[s][g]
    counts = [plan.batch_rows(k) for k in range(plan.num_batches)]
    assert all(c == batch for c in counts[:-1]) and 0 < counts[-1] <= batch
    assert sum(plan.batch_payload(k) for k in range(plan.num_batches)) == int(
        row_bytes.of(span).sum()
    )


@given(
    st.lists(st.floats(0.05, 10), min_size=1, max_size=5),
    st.lists(st.integers(0, 300), min_size=5, max_size=5),
)
@settings(max_examples=200, deadline=None)
def test_mixture_windows_stay_near_their_weights(weights, available):
    available = available[: len(weights)]
    schedule = interleave(weights, available)
    shares = np.asarray(weights) / sum(weights)
    assert all((schedule == i).sum() <= available[i] for i in range(len(weights)))
    cum = np.zeros((len(schedule) + 1, len(weights)))
    for i in range(len(weights)):
        cum[1:, i] = np.cumsum(schedule == i)
    for n in (1, 3, 10, 50):
        if n > len(schedule):
            break
        counts = cum[n:] - cum[:-n]
        assert (np.abs(counts - n * shares) <= WINDOW_DEVIATION).all()
    # the schedule ends only when the next pick has nothing left
    assert len(schedule) == 0 or any(
        (schedule == i).sum() == available[i] for i in range(len(weights))
    )


def test_mixture_refuses_bad_weights():
    with pytest.raises(ValueError, match="weights"):
        interleave([0.0, 0.0], [3, 3])
    with pytest.raises(ValueError, match="weights"):
        interleave([1.0, -1.0], [3, 3])
    with pytest.raises(ValueError, match="2 weights for 3 sources"):
        interleave([1.0, 1.0], [3, 3, 3])
