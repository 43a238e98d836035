"""Size-aware batching (``shardfeed.planning.batching`` and the ``shardfeed.batching`` facade).

Invariants over random streams with hypothesis: no batch exceeds the budget (except a lone
oversized sample with ``oversize="alone"``), every rank has the same number of steps, every
sample of every stream is in exactly one batch, in reading order, and the plan is deterministic.
Then an end-to-end run: ``write_dataset`` -> ``assign`` -> ``cost_batches``.
"""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardfeed import open_dataset, write_dataset
from shardfeed.assignment import World, assign, load_assignment
from shardfeed.batching import BatchingError, OversizeError, RankBatches, cost_batches
from shardfeed.formats.sample_index import (
    SampleCostMissingError,
    read_sample_bytes,
    read_sample_cost,
    write_sample_index,
)
from shardfeed.planning.batching import equalise, pack, plan_batches
from shardfeed.schemas import Feature, FeatureSpec
from shardfeed.schemas.manifest import MANIFEST_PATH, SAMPLE_INDEX_PATH, Manifest

# --------------------------------------------------------------------------------------------
# helpers


def batch_costs(costs: np.ndarray, bounds: np.ndarray) -> list[int]:
    return [int(costs[a:b].sum()) for a, b in itertools.pairwise(bounds)]


def check_plan(streams, plan, max_cost: int, oversize: str = "error") -> None:
    """Every invariant of a batch plan over ``streams[rank][worker]``."""
    steps = {rank: sum(len(b) - 1 for b in bounds) for rank, bounds in plan.bounds.items()}
    assert set(steps.values()) <= {plan.steps}  # equal steps on every rank
    for rank, bounds in plan.bounds.items():
        assert len(bounds) == len(streams[rank])
        for costs, b in zip(streams[rank], bounds, strict=True):
            costs = np.asarray(costs)
            # every sample exactly once, in order: bounds run 0 .. len, strictly increasing
            assert b.dtype == np.int64
            assert b[0] == 0 and b[-1] == len(costs)
            assert (np.diff(b) > 0).all()
            for (a, e), total in zip(itertools.pairwise(b), batch_costs(costs, b), strict=True):
                if total > max_cost:  # only a lone oversized sample may exceed the budget
                    assert oversize == "alone" and e - a == 1 and costs[a] > max_cost


def min_batches(costs: np.ndarray, max_cost: int) -> int:
    """Brute force: the fewest consecutive batches under ``max_cost`` (dynamic programming)."""
    n = len(costs)
    best = [0] + [n + 1] * n
    for e in range(1, n + 1):
        for a in range(e):
            if costs[a:e].sum() <= max_cost:
                best[e] = min(best[e], best[a] + 1)
    return best[n]


@st.composite
def worlds(draw, equal: bool = True):
    """(streams[rank][worker] of costs, max_cost): costs fit the budget one by one."""
    max_cost = draw(st.integers(1, 200))
    ranks = draw(st.integers(1, 6))
    workers = draw(st.integers(1, 4))
    per_rank = draw(st.integers(0, 60))
    streams = []
    for _ in range(ranks):
        total = per_rank if equal else draw(st.integers(0, 60))
        cuts = sorted(
            draw(st.lists(st.integers(0, total), min_size=workers - 1, max_size=workers - 1))
        )
        lengths = np.diff([0, *cuts, total])
        seed = draw(st.integers(0, 2**32 - 1))
        rng = np.random.default_rng(seed)
        skew = draw(st.sampled_from([1.0, 0.3, 0.05]))
        streams.append(
            [
                np.minimum(rng.geometric(1 / max(1.0, skew * max_cost), n), max_cost)
                * (rng.random(n) > 0.05)
                for n in lengths
            ]
        )
    return streams, max_cost


# --------------------------------------------------------------------------------------------
# the planner


@settings(max_examples=300, deadline=None)
@given(worlds())
def test_budget_steps_and_coverage(world):
    streams, max_cost = world
    plan = plan_batches(streams, max_cost)
    check_plan(streams, plan, max_cost)
    assert set(plan.bounds) == set(range(len(streams)))
    # the target is the largest packed count, and packing is optimal for consecutive batches
    packed = [sum(len(pack(c, max_cost)) - 1 for c in workers) for workers in streams]
    assert plan.steps == max(packed, default=0)
    # deterministic
    again = plan_batches([[c.copy() for c in workers] for workers in streams], max_cost)
    assert again.steps == plan.steps
    for rank in plan.bounds:
        for a, b in zip(plan.bounds[rank], again.bounds[rank], strict=True):
            np.testing.assert_array_equal(a, b)


@settings(max_examples=150, deadline=None)
@given(worlds(equal=False))
def test_unequal_streams_equalise_or_say_why(world):
    streams, max_cost = world
    samples = [sum(len(c) for c in workers) for workers in streams]
    packed = [sum(len(pack(c, max_cost)) - 1 for c in workers) for workers in streams]
    target = max(packed, default=0)
    if target > min(samples, default=0):
        with pytest.raises(BatchingError, match="too few for"):
            plan_batches(streams, max_cost)
        return
    plan = plan_batches(streams, max_cost)
    check_plan(streams, plan, max_cost)
    assert plan.steps == target


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 50), max_size=14), st.integers(50, 120))
def test_packing_is_optimal_for_consecutive_batches(costs, max_cost):
    costs = np.array(costs, dtype=np.int64)
    bounds = pack(costs, max_cost)
    assert len(bounds) - 1 == min_batches(costs, max_cost)
    assert max(batch_costs(costs, bounds), default=0) <= max_cost


@settings(max_examples=150, deadline=None)
@given(worlds(), st.data())
def test_oversized_samples_are_refused_or_batched_alone(world, data):
    streams, max_cost = world
    flat = [(r, w) for r, workers in enumerate(streams) for w, c in enumerate(workers) if len(c)]
    if not flat:
        return
    r, w = data.draw(st.sampled_from(flat))
    position = data.draw(st.integers(0, len(streams[r][w]) - 1))
    streams[r][w] = streams[r][w].copy()
    streams[r][w][position] = max_cost + data.draw(st.integers(1, 1000))
    with pytest.raises(OversizeError) as err:
        plan_batches(streams, max_cost)
    first = next(i for i, c in enumerate(streams[r][w]) if c > max_cost)
    assert (err.value.rank, err.value.worker, err.value.position) == (r, w, first)
    assert f"rank {r}, worker {w}" in str(err.value) and "oversize='alone'" in str(err.value)
    plan = plan_batches(streams, max_cost, oversize="alone")
    check_plan(streams, plan, max_cost, oversize="alone")


def test_lighter_ranks_split_their_costliest_batches_at_the_halfway_sample():
    heavy = [np.full(8, 10)]  # 8 batches of one sample at max_cost 10
    light = [np.array([1, 1, 1, 1, 1, 1, 1, 1])]  # packs into one batch of 8
    plan = plan_batches([heavy, light], 10)
    assert plan.steps == 8
    assert plan.bounds[1][0].tolist() == list(range(9))  # split down to single samples
    light = [np.array([4, 1, 1, 4, 1, 1, 1, 1])]  # one batch of cost 14 > 10: two batches
    plan = plan_batches([[np.full(3, 10)], light], 10)
    # packed [4 1 1 4 | 1 1 1 1]: the costliest (10) splits at its halfway point, after 4 1
    assert plan.bounds[1][0].tolist() == [0, 2, 4, 8]
    # equalise itself: splits spread over workers, costliest first, ties to the lower worker
    bounds = equalise([np.array([3, 3]), np.array([3, 3])], [np.array([0, 2]), np.array([0, 2])], 3)
    assert [b.tolist() for b in bounds] == [[0, 1, 2], [0, 2]]


def test_ranks_subset_matches_the_full_plan_and_errors_are_clear():
    rng = np.random.default_rng(5)
    streams = [[rng.integers(0, 30, 40), rng.integers(0, 30, 25)] for _ in range(5)]
    full = plan_batches(streams, 60)
    part = plan_batches(streams, 60, ranks=[3, 1, 3])
    assert sorted(part.bounds) == [1, 3] and part.steps == full.steps
    for rank in (1, 3):
        for a, b in zip(part.bounds[rank], full.bounds[rank], strict=True):
            np.testing.assert_array_equal(a, b)
    with pytest.raises(BatchingError, match="rank 7 is outside"):
        plan_batches(streams, 60, ranks=[7])
    with pytest.raises(ValueError, match="max_cost must be a positive integer"):
        plan_batches(streams, 0)
    with pytest.raises(ValueError, match="max_cost must be a positive integer"):
        plan_batches(streams, 2.5)
    with pytest.raises(ValueError, match="oversize must be one of"):
        plan_batches(streams, 60, oversize="drop")
    with pytest.raises(BatchingError, match="costs must be >= 0"):
        plan_batches([[np.array([1, -1])]], 60)
    with pytest.raises(BatchingError, match=r"rank 0 reads 2 samples, too few for 3 batches"):
        plan_batches([[np.array([5, 5])], [np.array([5, 5, 5])]], 5)
    empty = plan_batches([[np.zeros(0)], [np.zeros(0)]], 5)
    assert empty.steps == 0 and [b[0].tolist() for b in empty.bounds.values()] == [[0], [0]]


# --------------------------------------------------------------------------------------------
# end to end: write_dataset -> assign -> cost_batches


@pytest.fixture(scope="module")
def text_dataset(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("batching") / "ds"
    rng = np.random.default_rng(11)
    n = 1500
    lengths = np.minimum(rng.lognormal(5, 1.0, n).astype(int) + 1, 4000)
    spec = FeatureSpec((Feature("text", "string"), Feature("id", "int64")))
    write_dataset(
        root,
        spec,
        {"text": ["é" * int(k) for k in lengths], "id": np.arange(n)},
        target_shard_size="60KB",
        row_group_size="16KB",
    )
    assign(root, World(2, 2, 3), name="run", epochs=2, batch_size=4)
    return root


@pytest.mark.parametrize("epoch", [0, 1])
def test_cost_batches_on_an_assignment(text_dataset, epoch):
    root = text_dataset
    ds = open_dataset(root)
    costs = read_sample_cost(root).astype(np.int64)
    assert ds.manifest.cost.kind == "tokens"
    max_cost = 2000
    everything = cost_batches(root, "run", epoch, max_cost)
    assert len(everything) == 4 and all(isinstance(r, RankBatches) for r in everything)
    steps = {r.steps for r in everything}
    assert len(steps) == 1 and steps.pop() > 20  # equal steps on every rank
    plan = load_assignment(root, "run")
    texts = ds.read(0, len(ds), columns=["text"])["text"]
    for rank in everything:
        assert (rank.epoch, rank.kind, rank.max_cost) == (epoch, "tokens", max_cost)
        assert len(rank.workers) == 3
        seen = []
        for worker, batches in enumerate(rank.workers):
            spans = plan.spans(rank.rank, worker, epoch)
            np.testing.assert_array_equal(batches.spans.start, spans.start)
            ids = batches.sample_ids()
            assert len(ids) == spans.total_rows
            for i, batch in enumerate(batches):
                batch_ids = ids[batches.bounds[i] : batches.bounds[i + 1]]
                assert len(batch_ids) >= 1
                assert int(costs[batch_ids].sum()) == int(batches.cost[i]) <= max_cost
                # the batch's spans read exactly its samples, in order
                first = np.array([s.index_start for s in ds.shards])[batch.shard]
                read = np.concatenate(
                    [
                        np.arange(f + a, f + b)
                        for f, a, b in zip(first, batch.start, batch.end, strict=True)
                    ]
                )
                np.testing.assert_array_equal(read, batch_ids)
                # and the recorded cost is the documented token proxy of the text read back
                assert batches.cost[i] == sum(-(-len(texts[j].encode()) // 4) for j in batch_ids)
            seen.append(ids)
        # every assigned sample of the rank appears exactly once, in reading order
        assigned = [_ids(plan.spans(rank.rank, w, epoch), ds) for w in range(plan.world.workers)]
        np.testing.assert_array_equal(np.concatenate(seen), np.concatenate(assigned))
        assert len(np.concatenate(seen)) == plan.header.counts(epoch).samples_per_rank
        order = list(rank.loader_order())
        assert len(order) == rank.steps and len(set(order)) == rank.steps
        assert order[: len(rank.workers)] == [(w, 0) for w in range(len(rank.workers))]
    # one rank alone is the same as that rank in the full answer, and it is deterministic
    two = cost_batches(ds, plan, epoch, max_cost, rank=2)
    assert two.steps == everything[2].steps
    for a, b in zip(two.workers, everything[2].workers, strict=True):
        np.testing.assert_array_equal(a.bounds, b.bounds)
        np.testing.assert_array_equal(a.cost, b.cost)


def test_cost_batches_errors(text_dataset, tmp_path):
    root = text_dataset
    costs = read_sample_cost(root)
    biggest = int(np.argmax(costs))
    with pytest.raises(OversizeError, match=rf"sample {biggest} \(stream position \d+\) costs"):
        cost_batches(root, "run", 0, int(costs.max()) - 1)
    alone = cost_batches(root, "run", 0, int(costs.max()) - 1, oversize="alone")
    assert len({r.steps for r in alone}) == 1
    lone = [
        (w, i)
        for r in alone
        for w in r.workers
        for i in range(len(w))
        if w.cost[i] > int(costs.max()) - 1
    ]
    assert lone and all(w.bounds[i + 1] - w.bounds[i] == 1 for w, i in lone)
    with pytest.raises(KeyError, match="has no epoch 5"):
        cost_batches(root, "run", 5, 1000)
    # an assignment of another dataset is refused
    other = tmp_path / "other"
    spec = FeatureSpec((Feature("text", "string"),))
    write_dataset(other, spec, {"text": ["abc"] * 40})
    with pytest.raises(BatchingError, match="was planned for dataset"):
        cost_batches(other, load_assignment(root, "run"), 0, 1000)


def test_cost_batches_on_a_dataset_without_costs(tmp_path):
    root = tmp_path / "ds"
    spec = FeatureSpec((Feature("text", "string"), Feature("id", "int64")))
    manifest = write_dataset(root, spec, {"text": ["ab" * i for i in range(60)], "id": range(60)})
    record = write_sample_index(str(root), [read_sample_bytes(root)])
    files = tuple(record if f.path == SAMPLE_INDEX_PATH else f for f in manifest.files)
    (root / MANIFEST_PATH).write_text(dataclasses.replace(manifest, files=files, cost=None).dumps())
    assign(root, World(1, 2, 1), name="run")
    with pytest.raises(SampleCostMissingError, match="re-run shardfeed convert"):
        cost_batches(root, "run", 0, 100)


def _ids(spans, ds) -> np.ndarray:
    first = np.array([s.index_start for s in ds.shards], dtype=np.int64)[spans.shard]
    parts = [np.arange(f + a, f + b) for f, a, b in zip(first, spans.start, spans.end, strict=True)]
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def test_manifest_round_trip_keeps_cost(text_dataset):
    manifest = Manifest.loads((text_dataset / MANIFEST_PATH).read_text())
    assert Manifest.loads(manifest.dumps()).cost == manifest.cost
