"""What Beam's workers say of themselves: a tiny pipeline shared by the worker-process tests
(``test_sdk_worker.py``, ``test_worker_forks.py``; workers import this module through
``PYTHONPATH``)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from pathlib import Path

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

from shardfeed.pipelines.runners import make_runner


def reports_from_workers(args: Sequence[str], report: Callable[[int], str], out: Path) -> set[str]:
    """Run ``report`` on 8 elements spread over the workers Beam flags ``args`` pick; the
    distinct strings it returned (each written under ``out``)."""
    options = PipelineOptions(list(args))
    with beam.Pipeline(runner=make_runner(options), options=options) as p:
        _ = (
            p
            | beam.Create(range(8))
            | beam.Reshuffle()
            | beam.Map(report)
            | beam.Map(
                lambda said: out.joinpath(hashlib.sha256(said.encode()).hexdigest()).write_text(
                    said
                )
            )
        )
    return {path.read_text() for path in out.iterdir()}
