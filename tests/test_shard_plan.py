"""Invariants of the bucket shard planner (pure; no Beam)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from shardfeed.planning.shard_plan import (
    BIG_BUCKET_BASE,
    BucketTotal,
    bucket_of,
    plan_shards,
)


def _totals(sizes: np.ndarray, keys: np.ndarray, target: int) -> dict[int, BucketTotal]:
    out: dict[int, BucketTotal] = {}
    for key, size in zip(keys.tolist(), sizes.tolist(), strict=True):
        b = bucket_of(key, size, target)
        t = BucketTotal(b, 1, 1, size)
        out[b] = out[b] + t if b in out else t
    return out


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 3000), shards=st.integers(1, 12), seed=st.integers(0, 2**16))
def test_every_unit_is_planned_once_and_totals_add_up(n, shards, seed):
    rng = np.random.default_rng(seed)
    sizes = rng.lognormal(6, 1.5, n).astype(np.int64) + 1
    target = max(1, int(sizes.sum() // shards))
    totals = _totals(sizes, rng.integers(0, 2**63, n), target)
    plan = plan_shards(totals.values(), target)
    assert set(plan.shard_of) == set(totals)
    assert sum(plan.units) == n and sum(plan.rows) == n and sum(plan.bytes) == int(sizes.sum())
    assert all(u > 0 for u in plan.units)  # no empty shards
    assert plan.row_start == tuple(np.concatenate([[0], np.cumsum(plan.rows)[:-1]]).tolist())
    # an oversized unit sits alone in its shard
    for bucket, shard in plan.shard_of.items():
        if bucket >= BIG_BUCKET_BASE:
            assert plan.units[shard] == 1


def test_balance_on_a_long_tail():
    rng = np.random.default_rng(0)
    sizes = rng.lognormal(10, 1.0, 100_000).astype(np.int64)
    target = int(sizes.sum() // 40)
    plan = plan_shards(_totals(sizes, rng.integers(0, 2**63, len(sizes)), target).values(), target)
    assert plan.num_shards == 40
    assert max(plan.bytes) / np.mean(plan.bytes) <= 1.02


def test_partial_totals_of_a_bucket_plan_like_merged_ones():
    parts = [
        BucketTotal(3, 1, 10, 100),
        BucketTotal(5, 2, 20, 300),
        BucketTotal(3, 1, 5, 50),
        BucketTotal(9, 1, 1, 80),
    ]
    merged = [BucketTotal(3, 2, 15, 150), BucketTotal(5, 2, 20, 300), BucketTotal(9, 1, 1, 80)]
    assert plan_shards(parts, 200) == plan_shards(list(reversed(merged)), 200)


@settings(max_examples=60, deadline=None)
@given(
    files=st.lists(st.lists(st.integers(1, 5000), min_size=1, max_size=40), min_size=1, max_size=6),
    target=st.integers(1, 40000),
)
def test_contiguous_plan_keeps_order_and_drops_empty_shards(files, target):
    from shardfeed.planning.shard_plan import plan_contiguous

    named = {f"f{i}": np.array(sizes, dtype=np.int64) for i, sizes in enumerate(files)}
    plan = plan_contiguous(
        [(name, int(sizes.sum())) for name, sizes in named.items()],
        lambda name: (named[name], np.full(len(named[name]), 2, dtype=np.int64)),
        target,
    )
    shards = np.concatenate([plan.shards_of(name, sizes) for name, sizes in named.items()])
    assert np.all(np.diff(shards) >= 0)  # source order: shard numbers never go back
    assert shards[0] == 0 and set(shards.tolist()) == set(range(plan.num_shards))  # none empty
    assert sum(plan.units) == len(shards) and sum(plan.rows) == 2 * len(shards)
    all_sizes = np.concatenate(list(named.values()))
    assert sum(plan.bytes) == int(all_sizes.sum())
    # every shard is within one unit of the mean size of a raw cut
    mean = all_sizes.sum() / len(plan.compact)
    assert max(plan.bytes) <= mean + all_sizes.max()
