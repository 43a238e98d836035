"""Property tests of the rank assignment planner (pure planning, no I/O, no Beam)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from shardfeed.planning.assign import (
    DROP,
    MIN_BLOCKS_PER_RANK,
    PAD,
    EpochPlan,
    Policy,
    World,
    plan_epoch,
    plan_homes,
    samples_per_rank,
)
from shardfeed.planning.resume import consumed_per_worker, resume_epoch, worker_rows
from shardfeed.planning.spans import RowBytes, Spans

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def make_dataset(
    seed: int, shards: int, rows: tuple[int, int], sigma: float, group_rows: int | None = None
) -> RowBytes:
    """Random shards and lognormal sample sizes; with ``group_rows``, each shard is also cut
    into row groups of 1 to ``group_rows`` rows (the layout the planner then reads by)."""
    rng = np.random.default_rng(seed)
    per_shard = rng.integers(rows[0], rows[1] + 1, shards)
    sizes = np.maximum(1, rng.lognormal(np.log(2000.0), sigma, int(per_shard.sum()))).astype(
        np.int64
    )
    groups = None
    if group_rows is not None:
        groups = []
        for n in per_shard.tolist():
            cuts = np.cumsum(rng.integers(1, group_rows + 1, n + 1))
            bounds = np.r_[0, cuts[cuts < n], n]
            groups.append(np.diff(bounds).tolist())
    return RowBytes.from_sizes(sizes, per_shard, groups)


def sequence_of(row_bytes: RowBytes) -> Spans:
    return Spans.whole_shards(np.diff(row_bytes.offsets))


def sample_ids(spans: Spans, row_bytes: RowBytes) -> np.ndarray:
    a, b = spans.to_global(row_bytes.offsets)
    if len(a) == 0:
        return np.zeros(0, dtype=np.int64)
    return np.concatenate([np.arange(x, y) for x, y in zip(a.tolist(), b.tolist(), strict=True)])


def per_rank(plan: EpochPlan, world: World, weights: np.ndarray | None = None) -> np.ndarray:
    values = plan.spans.rows if weights is None else weights
    return np.bincount(plan.rank, weights=values, minlength=world.ranks)


worlds = st.builds(
    World,
    nodes=st.integers(1, 6),
    gpus_per_node=st.integers(1, 4),
    workers=st.integers(1, 3),
)
policies = st.builds(
    Policy,
    mode=st.sampled_from([PAD, DROP]),
    batch_size=st.one_of(st.none(), st.integers(1, 6)),
    block_rows=st.one_of(st.none(), st.integers(1, 40)),
    seed=st.integers(0, 2**31),
)


@SETTINGS
@given(
    data_seed=st.integers(0, 10_000),
    shards=st.integers(1, 30),
    max_rows=st.integers(1, 300),
    sigma=st.floats(0.0, 1.5),
    world=worlds,
    policy=policies,
    epoch=st.integers(0, 5),
    group_rows=st.one_of(st.none(), st.integers(1, 120)),
)
def test_equal_counts_exact_coverage_and_determinism(
    data_seed, shards, max_rows, sigma, world, policy, epoch, group_rows
):
    row_bytes = make_dataset(data_seed, shards, (1, max_rows), sigma, group_rows)
    total = row_bytes.num_samples
    per = samples_per_rank(total, world.ranks, policy.mode, policy.batch_size)
    assume(per > 0 and total >= world.nodes)
    plan = plan_epoch(sequence_of(row_bytes), row_bytes, world, policy, epoch)

    # every rank reads exactly the same number of samples, a whole number of batches
    assert np.all(per_rank(plan, world) == per)
    batch = policy.batch_size or 1
    assert per % batch == 0
    # workers differ by at most one batch, and each worker's share is whole batches
    by_worker = np.bincount(
        plan.rank * world.workers + plan.worker,
        weights=plan.spans.rows,
        minlength=world.ranks * world.workers,
    ).reshape(world.ranks, world.workers)
    assert np.all(by_worker.max(axis=1) - by_worker.min(axis=1) <= batch)
    assert np.all(by_worker % batch == 0)
    np.testing.assert_array_equal(by_worker[0], worker_rows(per, world.workers, batch))

    # spans are non-empty, inside their shard, sorted by (rank, worker, seq), seq from 0
    rows_per_shard = np.diff(row_bytes.offsets)
    assert np.all(plan.spans.rows > 0)
    assert np.all(plan.spans.end <= rows_per_shard[plan.spans.shard])
    order = np.lexsort((plan.seq, plan.worker, plan.rank))
    np.testing.assert_array_equal(order, np.arange(len(plan)))
    group = plan.rank * world.workers + plan.worker
    firsts = np.r_[True, group[1:] != group[:-1]]
    assert np.all(plan.seq[firsts] == 0)
    assert np.all(np.diff(plan.seq)[~firsts[1:]] == 1)

    ids = sample_ids(plan.spans, row_bytes)
    unique = np.unique(ids)
    if policy.mode == DROP:
        assert len(unique) == len(ids)  # at most once per epoch
        assert plan.dropped == total - len(ids) and plan.padded == 0
    else:
        np.testing.assert_array_equal(unique, np.arange(total))  # every sample appears
        assert plan.padded == len(ids) - total and plan.dropped == 0

    again = plan_epoch(sequence_of(row_bytes), row_bytes, world, policy, epoch)
    for name in ("rank", "worker", "seq", "home"):
        np.testing.assert_array_equal(getattr(plan, name), getattr(again, name))
    for name in ("shard", "start", "end"):
        np.testing.assert_array_equal(getattr(plan.spans, name), getattr(again.spans, name))


@SETTINGS
@given(
    data_seed=st.integers(0, 10_000),
    nodes=st.integers(1, 8),
    shards_per_node=st.integers(4, 8),
    gpus=st.integers(1, 4),
    sigma=st.floats(0.0, 1.0),
    seed=st.integers(0, 1000),
    epoch=st.integers(0, 3),
    mode=st.sampled_from([PAD, DROP]),
)
def test_node_affinity(data_seed, nodes, shards_per_node, gpus, sigma, seed, epoch, mode):
    """With shards >= 4 x nodes, >= 90% of each node's bytes come from its own shard set."""
    row_bytes = make_dataset(data_seed, nodes * shards_per_node, (50, 200), sigma)
    world = World(nodes, gpus, 2)
    plan = plan_epoch(sequence_of(row_bytes), row_bytes, world, Policy(mode, seed=seed), epoch)
    node = plan.rank // gpus
    span_bytes = row_bytes.of(plan.spans)
    own = np.bincount(node, weights=span_bytes * plan.home, minlength=nodes)
    assert np.all(own / np.bincount(node, weights=span_bytes, minlength=nodes) >= 0.9)
    # each node's home set holds about 1/N of the bytes (a few hundred long-tailed samples per
    # node can leave a few percent, as the exchange that evens them out costs affinity)
    homes, _ = plan_homes(sequence_of(row_bytes), row_bytes, world, Policy(mode, seed=seed))
    home_bytes = np.bincount(homes.node, weights=row_bytes.of(homes.spans), minlength=nodes)
    assert home_bytes.max() / home_bytes.mean() <= 1.05


@SETTINGS
@given(
    data_seed=st.integers(0, 10_000),
    sigma=st.floats(0.0, 1.0),
    nodes=st.integers(1, 6),
    gpus=st.integers(1, 8),
    per=st.integers(100, 400),
    mode=st.sampled_from([PAD, DROP]),
    seed=st.integers(0, 1000),
    group_rows=st.one_of(st.none(), st.integers(1, 400)),
)
def test_bytes_balance_with_100_samples_per_rank(
    data_seed, sigma, nodes, gpus, per, mode, seed, group_rows
):
    world = World(nodes, gpus, 1)
    shards = 4 * nodes + data_seed % 7
    target = per * world.ranks
    rows = (target // shards, target // shards + 10)
    row_bytes = make_dataset(data_seed, shards, rows, sigma, group_rows)
    plan = plan_epoch(sequence_of(row_bytes), row_bytes, world, Policy(mode, seed=seed), 0)
    assert plan.samples_per_rank >= 100
    load = per_rank(plan, world, row_bytes.of(plan.spans))
    assert load.max() / load.mean() <= 1.02


@pytest.mark.parametrize("world", [World(16, 8, 4), World(4, 8, 2), World(1, 8, 8)])
def test_long_tail_sizes_balance_and_spans_stay_compact(world):
    """Lognormal sigma=1 (a long tail, the largest sample ~50x the median) and 300+ samples
    per rank: bytes within 2%, and far fewer spans than samples."""
    row_bytes = make_dataset(
        7, 4 * world.nodes + 3, (300 * world.gpus_per_node, 400 * world.gpus_per_node), 1.0
    )
    plan = plan_epoch(sequence_of(row_bytes), row_bytes, world, Policy(PAD, seed=3), 1)
    load = per_rank(plan, world, row_bytes.of(plan.spans))
    assert load.max() / load.mean() <= 1.02
    assert len(plan) < row_bytes.num_samples / 3


def test_epochs_reshuffle_but_node_sets_stay():
    row_bytes = make_dataset(1, 24, (200, 300), 0.5)
    world, policy = World(3, 2, 2), Policy(PAD, seed=11)
    first, second = (
        plan_epoch(sequence_of(row_bytes), row_bytes, world, policy, e) for e in (0, 1)
    )
    ids0, ids1 = sample_ids(first.spans, row_bytes), sample_ids(second.spans, row_bytes)
    assert not np.array_equal(ids0, ids1)  # a different order and split each epoch
    for node in range(world.nodes):  # but each node reads the same home rows
        mine0 = np.unique(sample_ids(first.spans.take(first.rank // 2 == node), row_bytes))
        mine1 = np.unique(sample_ids(second.spans.take(second.rank // 2 == node), row_bytes))
        np.testing.assert_array_equal(mine0, mine1)


def test_block_rows_knob_trades_spans_for_shuffle():
    row_bytes = make_dataset(2, 16, (900, 1000), 0.3)
    world = World(2, 2, 1)
    small = plan_epoch(sequence_of(row_bytes), row_bytes, world, Policy(PAD, block_rows=2), 0)
    large = plan_epoch(sequence_of(row_bytes), row_bytes, world, Policy(PAD, block_rows=50), 0)
    assert small.block_rows <= 2 < large.block_rows <= 50
    assert len(small) > 5 * len(large)


@SETTINGS
@given(
    data_seed=st.integers(0, 10_000),
    gpus=st.integers(1, 4),
    workers=st.integers(1, 3),
    batch=st.one_of(st.none(), st.integers(1, 64)),
    group_rows=st.integers(1, 30),  # under 1.5 blocks: blocks here are at least 30 rows
    seed=st.integers(0, 1000),
    epoch=st.integers(0, 3),
)
def test_each_row_group_is_read_in_one_run(
    data_seed, gpus, workers, batch, group_rows, seed, epoch
):
    """With the row groups known, a piece is a whole row group, so every (rank, worker) reads
    each group's rows in one run: a reader decodes each group once. (One node, ``drop``: padding
    repeats rows and node exchanges move single rows, both by design.)"""
    world = World(1, gpus, workers)
    row_bytes = make_dataset(data_seed, 20, (100 * gpus, 200 * gpus), 0.5, group_rows)
    plan = plan_epoch(
        sequence_of(row_bytes), row_bytes, world, Policy(DROP, batch, None, seed), epoch
    )
    # no group is cut into parts: each is under 1.5 blocks (samples_per_rank // 64 rows here)
    assert 2 * group_rows < 3 * (plan.samples_per_rank // MIN_BLOCKS_PER_RANK)
    for part in np.unique(plan.rank * workers + plan.worker):
        ids = sample_ids(plan.spans.take(plan.rank * workers + plan.worker == part), row_bytes)
        group = np.searchsorted(row_bytes.groups, ids, side="right") - 1
        runs = group[np.r_[True, group[1:] != group[:-1]]]
        assert len(runs) == len(np.unique(runs))


def test_row_groups_move_the_cuts_not_the_counts():
    """The same data with and without its row-group layout: the same counts and samples, and
    with the layout each rank reads fewer runs of row groups (fewer decodes)."""
    world, policy = World(2, 2, 1), Policy(DROP, 8, None, 5)
    grouped = make_dataset(4, 10, (1000, 1200), 0.5, 40)
    plain = RowBytes(grouped.prefix, grouped.offsets)
    runs = []
    for row_bytes in (grouped, plain):
        plan = plan_epoch(sequence_of(row_bytes), row_bytes, world, policy, 0)
        assert np.all(per_rank(plan, world) == plan.samples_per_rank)
        ids = sample_ids(plan.spans, row_bytes)
        assert len(np.unique(ids)) == len(ids) == row_bytes.num_samples - plan.dropped
        group = np.searchsorted(grouped.groups, ids, side="right") - 1
        rank = np.repeat(plan.rank, plan.spans.rows)
        runs.append(int(np.sum(np.r_[True, (group[1:] != group[:-1]) | (rank[1:] != rank[:-1])])))
    # grouped: groups are dealt whole, so one run per group plus at most one more for each cut
    # that makes a rank's count exact (gpus - 1 per node) and each node boundary; without the
    # layout, blocks are cut by rows wherever they fall
    assert runs[0] <= len(grouped.groups) - 1 + world.ranks < runs[1]


def group_runs(plan: EpochPlan, world: World, row_bytes: RowBytes) -> tuple[int, int]:
    """Runs of one row group read by one (rank, worker), over the whole plan, and the number of
    distinct groups read."""
    part = np.repeat(plan.rank * world.workers + plan.worker, plan.spans.rows)
    group = np.searchsorted(row_bytes.groups, sample_ids(plan.spans, row_bytes), side="right") - 1
    runs = np.r_[True, (group[1:] != group[:-1]) | (part[1:] != part[:-1])]
    return int(runs.sum()), len(np.unique(group))


@SETTINGS
@given(
    data_seed=st.integers(0, 10_000),
    world=worlds,
    batch=st.one_of(st.none(), st.integers(1, 16)),
    group_rows=st.integers(1, 200),
    per=st.integers(64, 600),
    seed=st.integers(0, 1000),
    epoch=st.integers(0, 3),
)
def test_ranks_share_only_the_row_groups_cut_to_make_counts_exact(
    data_seed, world, batch, group_rows, per, seed, epoch
):
    """Equal sample sizes (so whole groups always balance bytes): a row group is read in more
    than one run only where a rank's count is made exact (at most gpus - 1 cuts per node), a
    rank's workers are split, or a node's rows end; however small each rank's share is."""
    shards = 2 * world.nodes + data_seed % 5
    target = per * world.ranks
    row_bytes = make_dataset(
        data_seed, shards, (target // shards, target // shards + 8), 0.0, group_rows
    )
    policy = Policy(DROP, batch, None, seed)
    assume(samples_per_rank(row_bytes.num_samples, world.ranks, DROP, batch) > 0)
    plan = plan_epoch(sequence_of(row_bytes), row_bytes, world, policy, epoch)
    runs, groups = group_runs(plan, world, row_bytes)
    cuts = world.nodes * (world.gpus_per_node - 1) + world.ranks * (world.workers - 1)
    assert runs - groups <= cuts + 2 * world.nodes


def test_whole_groups_give_way_to_blocks_when_bytes_would_not_balance():
    """Two ranks, two row groups of 100 rows: dealt whole, one rank would read 3x the other's
    bytes, so the planner deals blocks instead; with equal sizes it deals the groups whole."""
    world, policy = World(1, 2, 1), Policy(DROP, None, None, 0)
    for sizes, whole in (
        (np.r_[np.full(100, 3000), np.full(100, 1000)], False),
        (np.full(200, 2000), True),
    ):
        row_bytes = RowBytes.from_sizes(sizes, np.array([200]), [[100, 100]])
        plan = plan_epoch(sequence_of(row_bytes), row_bytes, world, policy, 0)
        load = per_rank(plan, world, row_bytes.of(plan.spans))
        assert load.max() / load.mean() <= 1.02
        np.testing.assert_array_equal(per_rank(plan, world), 100)
        assert (plan.block_rows == 100) is whole
        assert (len(plan) == 2) is whole  # whole: one group per rank, one span each


def simulate_round_robin(batches: np.ndarray, batch: int, consumed: int) -> np.ndarray:
    """What torch's DataLoader delivers: one batch per worker in turn, skipping finished ones."""
    taken = np.zeros(len(batches), dtype=np.int64)
    left = consumed
    while left > 0:
        for w in range(len(batches)):
            if taken[w] < batches[w] * batch and left > 0:
                step = min(batch, left)
                taken[w] += step
                left -= step
    return taken


@given(
    per_batches=st.integers(1, 60),
    workers=st.integers(1, 6),
    batch=st.integers(1, 5),
    data=st.data(),
)
def test_consumed_per_worker_matches_round_robin(per_batches, workers, batch, data):
    per = per_batches * batch
    consumed = data.draw(st.integers(0, per))
    rows = worker_rows(per, workers, batch)
    expected = simulate_round_robin(rows // batch, batch, consumed)
    np.testing.assert_array_equal(consumed_per_worker(per, workers, batch, consumed), expected)


@SETTINGS
@given(
    data_seed=st.integers(0, 10_000),
    old=worlds,
    new=worlds,
    mode=st.sampled_from([PAD, DROP]),
    batch=st.one_of(st.none(), st.integers(1, 4)),
    seed=st.integers(0, 1000),
    fraction=st.floats(0.0, 1.0),
    group_rows=st.one_of(st.none(), st.integers(1, 60)),
)
def test_elastic_resume_loses_and_repeats_nothing(
    data_seed, old, new, mode, batch, seed, fraction, group_rows
):
    row_bytes = make_dataset(data_seed, 12, (20, 120), 0.8, group_rows)
    total = row_bytes.num_samples
    policy = Policy(mode, batch, None, seed)
    assume(samples_per_rank(total, old.ranks, mode, batch) > 0)
    plan = plan_epoch(sequence_of(row_bytes), row_bytes, old, policy, 2)
    steps = plan.samples_per_rank // (batch or 1)
    seen = int(fraction * steps) * (batch or 1) * old.ranks
    remaining = total - (
        plan.dropped + len(np.unique(consumed_ids(plan, old, batch, seen, row_bytes)))
    )
    assume(remaining == 0 or samples_per_rank(remaining, new.ranks, mode, batch) > 0)
    assume(remaining >= new.nodes)
    rest = resume_epoch(plan, old, policy, row_bytes, seen, new)

    epoch_set = np.unique(sample_ids(plan.spans, row_bytes))
    consumed = np.unique(consumed_ids(plan, old, batch, seen, row_bytes))
    resumed = sample_ids(rest.spans, row_bytes)
    assert np.all(per_rank(rest, new) == rest.samples_per_rank)
    assert not np.intersect1d(consumed, resumed).size  # nothing repeated
    assert len(resumed) - len(np.unique(resumed)) == rest.padded  # beyond counted padding
    covered = np.union1d(consumed, resumed)
    if mode == PAD:
        np.testing.assert_array_equal(covered, epoch_set)  # nothing lost
    else:
        assert len(np.setdiff1d(epoch_set, covered)) == rest.dropped  # only the counted drop


def consumed_ids(
    plan: EpochPlan, world: World, batch: int | None, seen: int, row_bytes: RowBytes
) -> np.ndarray:
    """Brute force: replay each worker's spans up to what it delivered."""
    done = consumed_per_worker(plan.samples_per_rank, world.workers, batch, seen // world.ranks)
    out = []
    for group in np.unique(plan.rank * world.workers + plan.worker):
        mask = plan.rank * world.workers + plan.worker == group
        ids = sample_ids(plan.spans.take(mask), row_bytes)
        out.append(ids[: done[group % world.workers]])
    return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)


def test_too_few_samples_is_a_clear_error():
    row_bytes = make_dataset(0, 1, (5, 5), 0.0)
    with pytest.raises(ValueError, match="cannot give each of 8 ranks"):
        plan_epoch(sequence_of(row_bytes), row_bytes, World(2, 4), Policy(DROP), 0)
    plan = plan_epoch(sequence_of(row_bytes), row_bytes, World(1, 8), Policy(PAD), 0)
    assert plan.samples_per_rank == 1 and plan.padded == 3
