"""``shardfeed stage`` with ``--runner=...``: the tier copies as a Beam pipeline.

The plan, the lock, the clean-up of temporary files, the manifest (copied last) and
locations.json stay with the driver; only the per-file copies fan out. Each element is one file
(``rel, size, sha256``), and each worker runs the same verified copy as the thread pool
(``formats/tier_copy.copy_if_needed``). Outcomes come back through Beam metrics.
"""

from __future__ import annotations

from collections.abc import Sequence

import apache_beam as beam
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions

from shardfeed.formats.storage import Location
from shardfeed.formats.tier_copy import Target, copy_if_needed
from shardfeed.pipelines.runners import make_runner
from shardfeed.pipelines.spread import Spread
from shardfeed.pipelines.worker_guard import guard_worker
from shardfeed.planning.staging import CopyTask

_OUTCOMES = ("copied", "recopied", "skipped")


def copy_one(task: tuple[str, int, str], source: Location, target: Target) -> None:
    guard_worker()
    rel, size, sha256 = task
    outcome, nbytes = copy_if_needed(source, target, rel, size, sha256)
    beam.metrics.Metrics.counter("shardfeed-stage", outcome).inc()
    beam.metrics.Metrics.counter("shardfeed-stage", "bytes").inc(nbytes)


class CopyToTier(beam.PTransform):
    """(rel, size, sha256) per file -> each copied to the tier, verified, atomically."""

    def __init__(self, source: Location, target: Target) -> None:
        super().__init__()
        self.source, self.target = source, target

    def expand(self, tasks: beam.PCollection) -> beam.PCollection:
        return tasks | "Spread" >> Spread() | "Copy" >> beam.Map(copy_one, self.source, self.target)


def run_copies(
    source: Location, target: Target, tasks: Sequence[CopyTask], beam_args: Sequence[str]
) -> dict[str, int]:
    """Run the copies; returns the workers' counts: copied, recopied, skipped and bytes."""
    options = PipelineOptions(list(beam_args))
    pipeline = beam.Pipeline(runner=make_runner(options), options=options)
    _ = (
        pipeline
        | "Files" >> beam.Create([(t.rel, t.bytes, t.sha256) for t in tasks], reshuffle=False)
        | "CopyToTier" >> CopyToTier(source, target)
    )
    result = pipeline.run()
    result.wait_until_finish()
    counters = {
        r.key.metric.name: r.committed or r.attempted or 0
        for r in result.metrics().query(MetricsFilter().with_namespace("shardfeed-stage"))[
            "counters"
        ]
    }
    return {name: int(counters.get(name, 0)) for name in (*_OUTCOMES, "bytes")}
