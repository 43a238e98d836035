"""The loader's read schedule: which decode of a row group serves each piece."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardfeed.loader.schedule import schedule_reads

pieces = st.lists(st.tuples(st.integers(0, 1), st.integers(0, 2), st.integers(0, 3)), max_size=60)


@given(pieces, st.integers(0, 8))
@settings(max_examples=300, deadline=None)
def test_reads_serve_their_pieces_and_repeat_only_past_the_window(keys, window):
    stream, shard, group = (np.array([k[i] for k in keys], dtype=np.int64) for i in range(3))
    s = schedule_reads(stream, shard, group, window)
    n = len(keys)
    assert len(s.read) == n
    assert s.num_reads == len(s.last) == len(s.stream)
    for p, key in enumerate(keys):
        r = s.read[p]
        assert (s.stream[r], s.shard[r], s.group[r]) == key
        assert s.first[r] <= p <= s.last[r]
    # reads come in order of first use, and each read's first piece is the one that made it
    assert np.all(np.diff(s.first) > 0)
    assert all(s.read[s.first[r]] == r for r in range(s.num_reads))
    # consecutive uses of one row group share a decode exactly when they are window-close
    for p in range(n):
        later = [q for q in range(p + 1, n) if keys[q] == keys[p]]
        if later:
            assert (s.read[later[0]] == s.read[p]) == (later[0] - p <= window)
    # so at most window + 1 decoded groups are held at any piece
    for p in range(n):
        assert int(((s.first <= p) & (p <= s.last)).sum()) <= window + 1


def test_a_group_read_twice_when_its_uses_are_far_apart():
    shard = np.array([0, 1, 2, 3, 0], dtype=np.int64)
    zeros = np.zeros(5, dtype=np.int64)
    far = schedule_reads(zeros, shard, zeros, window=2)
    assert far.read.tolist() == [0, 1, 2, 3, 4]
    near = schedule_reads(zeros, shard, zeros, window=4)
    assert near.read.tolist() == [0, 1, 2, 3, 0]
    assert near.last.tolist() == [4, 1, 2, 3]


def test_negative_window_is_refused():
    with pytest.raises(ValueError, match="window"):
        schedule_reads(np.zeros(1, np.int64), np.zeros(1, np.int64), np.zeros(1, np.int64), -1)
