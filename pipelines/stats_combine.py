"""Dataset statistics as a Beam CombineFn: per-shard mergeable stats -> the dataset's stats.

Each shard writer summarises its rows (``formats/stats.py``: min, max, mean, std, count and a
quantile sketch per numeric feature). Merging floating-point sums is not associative to the last
bit, and a runner combines in whatever order it likes, so :class:`MergeShardStats` only *collects*
while combining (its accumulator is shard number -> stats) and merges once, in shard order, when it
extracts: ``stats.json`` is byte-identical on every runner and equal to ``merge_all`` in shard order.
The accumulator holds one small state per shard (a few KB per feature), not samples.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

import apache_beam as beam

from shardfeed.formats.stats import FeatureStats, merge_all
from shardfeed.formats.store_path import StorePath

StatsState = dict[str, dict[str, Any]]  # feature name -> FeatureStats.to_state()
MERGED_STATS = "stats-merged.json"  # under the work dir


class MergeShardStats(beam.CombineFn):
    """(shard number, stats state) ... -> the merged stats state, merged in shard order."""

    def create_accumulator(self) -> dict[int, StatsState]:
        return {}

    def add_input(
        self, accumulator: dict[int, StatsState], element: tuple[int, StatsState]
    ) -> dict[int, StatsState]:
        number, state = element
        _put(accumulator, number, state)
        return accumulator

    def merge_accumulators(
        self, accumulators: Iterable[dict[int, StatsState]]
    ) -> dict[int, StatsState]:
        merged: dict[int, StatsState] = {}
        for accumulator in accumulators:
            for number, state in accumulator.items():
                _put(merged, number, state)
        return merged

    def extract_output(self, accumulator: dict[int, StatsState]) -> StatsState:
        parts = [
            {name: FeatureStats.from_state(s) for name, s in accumulator[n].items()}
            for n in sorted(accumulator)
        ]
        return {name: stats.to_state() for name, stats in merge_all(parts).items()}


def save_merged_stats(state: StatsState, work: StorePath) -> None:
    """Leave the merged stats for the driver, which publishes them as ``meta/stats.json``."""
    (work / MERGED_STATS).write_bytes(json.dumps(state).encode(), durable=True)


def load_merged_stats(work: StorePath) -> dict[str, FeatureStats] | None:
    """The stats :class:`MergeShardStats` left under ``work``, or None when no shard was written."""
    try:
        state: Mapping[str, Any] = json.loads((work / MERGED_STATS).read_bytes())
    except FileNotFoundError:
        return None
    return {name: FeatureStats.from_state(s) for name, s in state.items()}


def _put(accumulator: dict[int, StatsState], number: int, state: StatsState) -> None:
    # a retried writer may report its shard again: same bytes, same stats; anything else is a bug
    if accumulator.get(number, state) != state:
        raise ValueError(f"shard {number} was summarised twice, differently")
    accumulator[number] = state
