"""``Spread`` (pipelines/spread.py): every element once, dealt out over the runner's workers."""

from __future__ import annotations

import os
from pathlib import Path

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that, equal_to

from shardfeed.pipelines.runners import make_runner
from shardfeed.pipelines.spread import Spread


def _local() -> beam.Pipeline:
    """A pipeline on the in-process runner the ``shardfeed`` command uses."""
    options = PipelineOptions([])
    return beam.Pipeline(runner=make_runner(options), options=options)


def test_every_element_comes_out_once_duplicates_included():
    elements = [3, 1, 1, "a", ("file", 2), ("file", 2), None]
    with _local() as p:
        out = p | beam.Create(elements, reshuffle=False) | Spread()
        assert_that(out, equal_to(elements))


def test_an_empty_collection_stays_empty():
    with _local() as p:
        out = p | beam.Create([]) | Spread()
        assert_that(out, equal_to([]))


def _leaf_names(pipeline: beam.Pipeline) -> list[str]:
    proto = pipeline.to_runner_api()
    return [t.unique_name for t in proto.components.transforms.values() if not t.subtransforms]


def test_two_steps_on_the_local_runner_and_reshuffle_elsewhere():
    """The in-process runner gets the light form; a runner that knows Reshuffle (Dask replaces it
    with nothing, Dataflow treats it specially) keeps it."""
    local = _local()
    _ = local | beam.Create([1, 2], reshuffle=False) | "S" >> Spread()
    names = _leaf_names(local)
    assert {"S/Key", "S/Group", "S/Values"} <= set(names)
    assert not any(name.startswith("S/Reshuffle") for name in names)
    from apache_beam.runners.dask.dask_runner import DaskRunner

    dask = beam.Pipeline(runner=DaskRunner())
    _ = dask | beam.Create([1, 2], reshuffle=False) | "S" >> Spread()
    assert any(name.startswith("S/Reshuffle") for name in _leaf_names(dask))


def _worker_pid(element: int, out: str) -> None:
    Path(out, str(element)).write_text(str(os.getpid()))


def test_elements_created_in_one_bundle_reach_both_workers(tmp_path, monkeypatch):
    """The file list is created without Beam's reshuffle (one bundle, one worker); the steps after
    a Spread run on both of two multi_processing workers, as they did after a Reshuffle."""
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).parent))  # workers import this module
    options = PipelineOptions(["--direct_running_mode=multi_processing", "--direct_num_workers=2"])
    with beam.Pipeline(runner=make_runner(options), options=options) as p:
        _ = (
            p
            | beam.Create(range(8), reshuffle=False)
            | Spread()
            | beam.Map(_worker_pid, str(tmp_path))
        )
    pids = {path.name: path.read_text() for path in tmp_path.iterdir()}
    assert sorted(pids, key=int) == [str(n) for n in range(8)]
    assert len(set(pids.values())) == 2, pids
