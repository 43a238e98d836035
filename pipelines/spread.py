"""``Spread``: a fusion break that deals a PCollection's elements out over the runner's workers.

Beam's ``Reshuffle`` does the same in four steps around its GroupByKey: it adds random keys, saves
each element's timestamp, restores it and drops the keys. A conversion is one batch pipeline in the
global window whose elements carry no timestamps, so two steps do: a random key, then the values.
Each step costs graph construction in the driver and set-up in every worker (Beam inspects every
DoFn's methods several times over), which the short text runs of BENCHMARKS.md pay in full.

Only Beam's in-process runner gets the two steps. Other runners know ``Reshuffle`` itself and keep
it: Dataflow treats it specially, and Beam's DaskRunner replaces it with nothing (a Dask bag moves
its data itself), where the two steps would add a shuffle.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from typing import Any

import apache_beam as beam


def _keyed(element: Any) -> tuple[int, Any]:
    """``element`` under a random key, so elements rarely share a group (as ``Reshuffle``'s)."""
    return random.getrandbits(32), element


def _values(group: tuple[int, Iterable[Any]]) -> Iterable[Any]:
    return group[1]


class Spread(beam.PTransform):
    """elements -> the same elements, each on whichever worker the runner deals it to."""

    def expand(self, pcoll: beam.PCollection) -> beam.PCollection:
        from apache_beam.runners.portability.fn_api_runner.fn_runner import FnApiRunner

        if not isinstance(pcoll.pipeline.runner, FnApiRunner):
            return pcoll | "Reshuffle" >> beam.Reshuffle()
        return (
            pcoll
            | "Key" >> beam.Map(_keyed)
            | "Group" >> beam.GroupByKey()
            | "Values" >> beam.FlatMap(_values)
        )
