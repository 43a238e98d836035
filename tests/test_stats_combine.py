"""MergeShardStats: any combining order gives exactly merge_all in shard order."""

from __future__ import annotations

import base64
import json
import random

import numpy as np
import pytest

beam = pytest.importorskip("apache_beam")

from apache_beam.testing.test_pipeline import TestPipeline as BeamPipeline  # noqa: E402
from apache_beam.testing.util import assert_that, equal_to  # noqa: E402

from shardfeed.formats.stats import FeatureStats, merge_all  # noqa: E402
from shardfeed.pipelines.stats_combine import MergeShardStats  # noqa: E402


def _shards(n: int = 12) -> list[tuple[int, dict]]:
    rng = np.random.default_rng(0)
    out = []
    for number in range(n):
        state = FeatureStats((3,)).add(rng.normal(number, 1 + number, size=(200, 3))).to_state()
        label = FeatureStats((1,), integer=True).add(rng.integers(0, 9, size=(200, 1))).to_state()
        out.append((number, {"x": state, "label": label}))
    return out


def _expected(shards: list[tuple[int, dict]]) -> dict:
    parts = [{k: FeatureStats.from_state(s) for k, s in state.items()} for _, state in shards]
    return {k: v.to_state() for k, v in merge_all(parts).items()}


def test_every_combining_order_merges_in_shard_order():
    shards = _shards()
    fn = MergeShardStats()
    expected = json.dumps(_expected(shards), sort_keys=True)
    for seed in range(5):
        order = shards[:]
        random.Random(seed).shuffle(order)
        # split into a few accumulators, combined in a shuffled order
        accumulators = []
        for i in range(0, len(order), 5):
            acc = fn.create_accumulator()
            for element in order[i : i + 5]:
                acc = fn.add_input(acc, element)
            accumulators.append(acc)
        random.Random(seed + 100).shuffle(accumulators)
        out = fn.extract_output(fn.merge_accumulators(accumulators))
        assert json.dumps(out, sort_keys=True) == expected


def test_in_a_beam_pipeline():
    shards = _shards(6)
    with BeamPipeline() as p:
        out = (
            p
            | beam.Create(shards, reshuffle=True)
            | beam.CombineGlobally(MergeShardStats()).without_defaults()
            | beam.Map(lambda s: json.dumps(s, sort_keys=True))
        )
        assert_that(out, equal_to([json.dumps(_expected(shards), sort_keys=True)]))


def test_a_shard_reported_twice_must_agree():
    fn = MergeShardStats()
    (number, state), (_, other) = _shards(2)
    acc = fn.add_input(fn.add_input(fn.create_accumulator(), (number, state)), (number, state))
    assert list(acc) == [number]
    with pytest.raises(ValueError, match="summarised twice"):
        fn.add_input(acc, (number, other))


def test_state_packs_sketch_levels_and_reads_both_forms():
    rng = np.random.default_rng(5)
    stats = FeatureStats((2,)).add(rng.normal(size=(5000, 2)))
    state = json.loads(json.dumps(stats.to_state()))
    assert all(isinstance(level, str) for level in state["arrays"]["levels"])
    again = FeatureStats.from_state(state)
    assert again.to_state() == stats.to_state()
    listed = json.loads(json.dumps(state))  # an older sidecar's plain lists read the same
    listed["arrays"]["levels"] = [
        np.frombuffer(base64.b64decode(level), "<f8").tolist()
        for level in state["arrays"]["levels"]
    ]
    assert FeatureStats.from_state(listed).to_state() == stats.to_state()
