"""A shard writer hands each episode's stats to the driver finished (``StatsSummary``), not as
mergeable sketches: the episodes table the driver writes is the same, from a much smaller sidecar."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest

from shardfeed.formats.meta_writer import episodes_table
from shardfeed.formats.publish import DatasetOptions, ShardOutcome, build_shard
from shardfeed.formats.stats import FeatureStats, StatsSummary, stats_from_state
from shardfeed.schemas.features import Feature, FeatureSpec


def _json_round_trip(state: dict) -> dict:
    return json.loads(json.dumps(state))


def test_a_summary_read_back_gives_the_stats_values():
    rng = np.random.default_rng(0)
    floats = rng.normal(size=(500, 2, 3))
    floats[7, 1, 2] = np.nan  # NaN stats stay JSON nulls
    ints = rng.integers(-(2**40), 2**40, size=(300, 4))
    for stats in (FeatureStats((2, 3)).add(floats), FeatureStats((4,), integer=True).add(ints)):
        back = stats_from_state(_json_round_trip(stats.summary().to_state()))
        assert isinstance(back, StatsSummary)
        assert back.to_json() == stats.to_json()
        assert (back.count, back.shape) == (stats.count, stats.shape)
        assert back.summary() is back
    values = FeatureStats((2, 3)).add(floats).to_json()
    assert values["mean"][1][2] is None and values["max"][1][2] is None  # JSON has no NaN
    assert all(isinstance(v, float) for v in values["mean"][0])
    # a sketch's state still reads back as the mergeable stats
    state = FeatureStats((3,)).add(floats[:, 0]).to_state()
    assert isinstance(stats_from_state(_json_round_trip(state)), FeatureStats)


def test_stats_without_values_summarise_to_none():
    empty = FeatureStats((3,)).summary()
    assert empty.count == 0 and empty.values is None
    with pytest.raises(ValueError, match="no values"):
        stats_from_state(_json_round_trip(empty.to_state())).to_json()


def _episodic_outcome(root: str) -> tuple[FeatureSpec, ShardOutcome]:
    spec = FeatureSpec(
        (
            Feature("observation.state", "float32", (3,)),
            Feature("episode_index", "int64"),
            Feature("index", "int64"),
            Feature("task_index", "int64"),
        )
    )
    lengths = [40, 3, 700]  # the last episode overflows the first sketch level
    rng = np.random.default_rng(1)
    n = sum(lengths)
    state = rng.normal(size=(n, 3)).astype(np.float32)
    table = pa.table(
        {
            "observation.state": pa.FixedSizeListArray.from_arrays(pa.array(state.reshape(-1)), 3),
            "episode_index": pa.array(np.repeat([5, 6, 9], lengths)),
            "index": pa.array(np.arange(n)),
            "task_index": pa.array(np.repeat([0, 1, 0], lengths)),
        },
        schema=spec.arrow_schema(),
    )
    options = DatasetOptions(tasks=("pick", "place"))
    return spec, build_shard(root, 0, table, spec, options, index_start=0)


def test_an_episodic_outcome_hands_over_summaries_and_the_same_episodes_table(tmp_path):
    spec, outcome = _episodic_outcome(str(tmp_path))
    state = outcome.to_state()
    for episode in state["episodes"]:
        for name, stats in episode["stats"].items():
            assert set(stats) == {"summary"}, name  # no sketch levels, no running sums
    back = ShardOutcome.from_state(_json_round_trip(state))
    assert episodes_table(spec, back.episodes).equals(episodes_table(spec, outcome.episodes))
    # a reused sidecar (a resumed run) is written again as it was read
    again = ShardOutcome.from_state(_json_round_trip(back.to_state()))
    assert again.to_state()["episodes"] == state["episodes"]
    # the shard's own stats stay mergeable: the run's stats.json merges them
    assert all(isinstance(s, FeatureStats) for s in back.stats.values())
