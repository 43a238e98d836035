"""``deal_whole``: pieces dealt whole to ranks, exact counts, few pieces shared (pure numpy)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from shardfeed.planning.spans import Spans
from shardfeed.planning.whole_pieces import deal_whole


def node_streams(seed: int, nodes: int, gpus: int, per_rank: int, max_piece: int) -> Spans:
    """Each node's ``gpus * per_rank`` rows as pieces of 1 to ``max_piece`` rows; piece ``i`` is
    rows ``[0, n)`` of shard ``i``, so every row of the stream has its own identity."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(nodes):
        left = gpus * per_rank
        while left:
            take = int(min(left, rng.integers(1, max_piece + 1)))
            rows.append(take)
            left -= take
    rows = np.array(rows, dtype=np.int64)
    return Spans(np.arange(len(rows)), np.zeros(len(rows)), rows)


@settings(max_examples=150, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    nodes=st.integers(1, 4),
    gpus=st.integers(1, 6),
    per_rank=st.integers(1, 300),
    max_piece=st.integers(1, 400),
)
def test_exact_counts_every_row_once_and_few_pieces_shared(seed, nodes, gpus, per_rank, max_piece):
    stream = node_streams(seed, nodes, gpus, per_rank, max_piece)
    weights = np.random.default_rng(seed + 1).uniform(1.0, 5.0, len(stream)) * stream.rows
    segments, rank = deal_whole(stream, weights, nodes, gpus, per_rank)

    np.testing.assert_array_equal(
        np.bincount(rank, weights=segments.rows, minlength=nodes * gpus), per_rank
    )
    # every row of the stream exactly once: segments of one piece tile it without overlap
    for piece in range(len(stream)):
        mine = segments.shard == piece
        bounds = np.sort(np.r_[segments.start[mine], segments.end[mine]])
        assert bounds[0] == 0 and bounds[-1] == stream.end[piece]
        assert np.all(bounds[1:-1:2] == bounds[2:-1:2])  # end of one is the start of the next
    # a rank reads its pieces in stream order, and only pieces of its own node
    assert np.all(np.diff(rank) >= 0)
    for r in range(nodes * gpus):
        np.testing.assert_array_equal(np.sort(segments.shard[rank == r]), segments.shard[rank == r])
    node_of_piece = (np.cumsum(stream.rows) - stream.rows) // (gpus * per_rank)
    np.testing.assert_array_equal(node_of_piece[segments.shard], rank // gpus)
    # only the pieces cut to make the counts exact are shared: at most gpus - 1 per node
    owners = np.bincount(segments.shard, minlength=len(stream))
    for node in range(nodes):
        assert np.sum(owners[node_of_piece == node] > 1) <= gpus - 1


def test_heaviest_first_to_the_lightest_rank_with_room():
    """Equal rows, unequal bytes: largest first to the lightest rank gives loads within one
    piece of each other (the LPT bound), where dealing in stream order would not."""
    rows = np.full(40, 10, dtype=np.int64)
    weights = np.r_[np.full(20, 9.0), np.full(20, 1.0)]  # the heavy pieces come first
    stream = Spans(np.arange(40), np.zeros(40), rows)
    segments, rank = deal_whole(stream, weights, 1, 2, 200)
    load = np.bincount(rank, weights=weights[segments.shard], minlength=2)
    np.testing.assert_array_equal(load, [100.0, 100.0])  # 10 heavy and 10 light each
    assert len(segments) == 40  # nothing needed cutting


def test_pieces_larger_than_a_rank_are_cut_between_ranks():
    stream = Spans([0, 1], [0, 0], [250, 50])  # one node, 3 ranks of 100 rows
    segments, rank = deal_whole(stream, np.array([250.0, 50.0]), 1, 3, 100)
    np.testing.assert_array_equal(np.bincount(rank, weights=segments.rows), [100, 100, 100])
    # the 50-row piece goes whole to one rank; the 250 rows fill the rooms left, in order
    assert sorted(zip(segments.shard.tolist(), segments.rows.tolist(), strict=True)) == [
        (0, 50),
        (0, 100),
        (0, 100),
        (1, 50),
    ]
