"""Run a conversion end to end: prepare DST, run the Beam graph, check rejects, publish, summarise.

The summary is built from what the pipeline wrote (shard sidecars and reject parts), never from
``result.metrics()``, which some runners (Dask on Beam 2.77) do not implement.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import apache_beam as beam
import numpy as np
import pyarrow.compute as pc
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.runner import PipelineState

from shardfeed.formats.layout import LISTED_DIRS
from shardfeed.formats.meta_writer import file_record
from shardfeed.formats.publish import DatasetOptions, ShardOutcome, prepare_root, publish
from shardfeed.formats.rejects import REJECTS_DIR
from shardfeed.formats.shard_writer import DEFAULT_ROW_GROUP_BYTES
from shardfeed.formats.sources import SourceReader, detect_kind, open_source
from shardfeed.formats.unit_table import UNIT_SUFFIX, read_totals, read_unit_sizes
from shardfeed.pipelines.convert import (
    PREVIOUS,
    WORK_DIR,
    GraphConfig,
    InferSchema,
    ScanFiles,
    WriteShards,
    read_inferred,
)
from shardfeed.pipelines.progress import WorkDirProgress
from shardfeed.pipelines.runners import make_runner
from shardfeed.planning.shard_plan import (
    FINE_BUCKETS,
    BucketTotal,
    plan_contiguous,
    plan_shards,
    totals_from_arrays,
)
from shardfeed.schemas.errors import ShardfeedError
from shardfeed.schemas.manifest import MANIFEST_PATH, Rejects
from shardfeed.schemas.rejects import RejectRecord
from shardfeed.transforms.image_policy import ImagePolicy


class TooManyRejectsError(ShardfeedError):
    pass


@dataclass(frozen=True)
class ConvertConfig:
    """What a conversion produces. ``content_options`` lists the fields that change output bytes."""

    src: str
    dst: str
    kind: str | None = None
    target_shard_bytes: int = 100 * 10**6
    row_group_bytes: int = DEFAULT_ROW_GROUP_BYTES
    shuffle_seed: int | None = 0  # None keeps the source order (--no-shuffle)
    validate: str = "full"
    image_format: str = "keep"
    max_image_side: int | None = None
    max_reject_fraction: float = 0.01
    overwrite: bool = False
    progress: bool = False  # force the progress line even when stderr is not a terminal
    source_options: dict[str, Any] = field(default_factory=dict)

    def image_policy(self) -> ImagePolicy:
        return ImagePolicy(self.validate, self.image_format, self.max_image_side)

    def content_options(self, kind: str) -> dict[str, Any]:
        return {
            "from": kind,
            "target_shard_size": self.target_shard_bytes,
            "row_group_size": self.row_group_bytes,
            "shuffle_seed": self.shuffle_seed,
            **self.image_policy().content_options(),
            **self.source_options,
        }


@dataclass
class ConvertSummary:
    dst: str
    samples_in: int
    samples_out: int
    shards: int
    rejects: dict[str, int]
    payload_bytes: int
    bytes: int
    seconds: float
    notes: list[str]
    published: bool
    phases: dict[str, float] = field(default_factory=dict)  # wall seconds per phase, in run order

    def to_json(self) -> dict[str, Any]:
        return {
            "dst": self.dst,
            "published": self.published,
            "samples_in": self.samples_in,
            "samples_out": self.samples_out,
            "shards": self.shards,
            "rejects": {
                "total": sum(self.rejects.values()),
                "by_reason": dict(sorted(self.rejects.items())),
            },
            "payload_bytes": self.payload_bytes,
            "bytes": self.bytes,
            "compression_ratio": round(self.payload_bytes / self.bytes, 4) if self.bytes else None,
            "seconds": round(self.seconds, 3),
            "samples_per_s": round(self.samples_out / self.seconds, 1) if self.seconds else None,
            "phases": {name: round(seconds, 3) for name, seconds in self.phases.items()},
            "notes": self.notes,
        }


def run_convert(config: ConvertConfig, beam_args: Sequence[str] = ()) -> ConvertSummary:
    """Convert ``config.src`` into a published dataset at ``config.dst`` (raises on failure)."""
    started = time.monotonic()
    clock = _PhaseClock(started)
    kind = config.kind or detect_kind(config.src)
    media = {"media_hook": config.image_policy()} if kind == "imagefolder" else {}
    source = open_source(config.src, kind, **media, **config.source_options)
    meta = source.meta()
    dst = os.path.abspath(config.dst)
    takeover = _only_leftovers(dst) and not config.overwrite
    if not takeover:
        prepare_root(dst, config.overwrite)
    options = DatasetOptions(
        tasks=meta.tasks,
        fps=meta.fps,
        robot_type=meta.robot_type,
        target_shard_bytes=config.target_shard_bytes,
        row_group_bytes=config.row_group_bytes,
        source=os.path.basename(os.path.abspath(config.src).rstrip("/")),
        content_options=config.content_options(kind),
    )
    graph = GraphConfig(dst=dst, seed=config.shuffle_seed or 0, options=options)
    if takeover:
        _keep_finished_shards(dst, graph.work)
    else:
        shutil.rmtree(graph.work, ignore_errors=True)
    files = source.files()
    pipeline_options = PipelineOptions(list(beam_args))
    clock.mark("open")

    # 0. data-typed sources (JSONL) infer their schema from every file first
    inferred = None
    if hasattr(source, "infer"):
        _run(
            pipeline_options,
            lambda p: (
                p | "ListFiles" >> beam.Create(files) | "InferSchema" >> InferSchema(source, graph)
            ),
        )
        inferred = _merge_inferred(source, graph, files)
        clock.mark("infer")
    spec = source.spec(inferred)

    progress = WorkDirProgress(graph.work, len(files), force=config.progress)
    # 1. scan: every file's unit table, bucket totals and rejects land under the work dir
    with progress:
        _run(
            pipeline_options,
            lambda p: (
                p
                | "ListFiles" >> beam.Create(files)
                | "ScanFiles" >> ScanFiles(source, spec, graph)
            ),
        )
    clock.mark("scan")
    reject_names, reject_counts = _collect_rejects(graph.work)
    rejected_units = sum(reject_counts.values())
    # 2. plan on the driver from the small per-file totals
    if config.shuffle_seed is None:
        plan = plan_contiguous(
            [(f, _file_bytes(graph, f)) for f in files],
            lambda f: _unit_sizes(graph, f),
            config.target_shard_bytes,
        )
    else:
        plan = plan_shards(_read_totals(graph, files), config.target_shard_bytes)
    total_units = sum(plan.units) + rejected_units
    if total_units and rejected_units / total_units > config.max_reject_fraction:
        raise TooManyRejectsError(
            f"{rejected_units} of {total_units} records rejected ({rejected_units / total_units:.2%}) exceeds "
            f"--max-reject-fraction {config.max_reject_fraction:.2%}; nothing was published. "
            f"Reasons: {dict(sorted(reject_counts.items()))}. Reject details are in {graph.work}/rejects/"
        )
    clock.mark("plan")
    # 3. write: each shard writer reads its own units; payloads never cross the shuffle
    progress.total_shards = plan.num_shards
    if plan.num_shards:
        with progress:
            _run(
                pipeline_options,
                lambda p: (
                    p
                    | "ListFiles" >> beam.Create(files)
                    | "WriteShards" >> WriteShards(source, spec, plan, graph)
                ),
            )
    outcomes = _read_outcomes(graph.work)
    if len(outcomes) != plan.num_shards:
        raise ShardfeedError(
            f"the runner wrote {len(outcomes)} of {plan.num_shards} planned shards; nothing was published"
        )
    clock.mark("write")
    _remove_unplanned(dst, outcomes)
    extra = _move_rejects(dst, graph.work, reject_names)
    publish(
        dst,
        spec,
        outcomes,
        options,
        rejects=Rejects(rejected_units, reject_counts),
        extra_files=extra,
    )
    shutil.rmtree(graph.work, ignore_errors=True)
    clock.mark("publish")
    samples_out = sum(o.record.rows for o in outcomes)
    return ConvertSummary(
        dst=dst,
        samples_in=samples_out + rejected_units,
        samples_out=samples_out,
        shards=len(outcomes),
        rejects=reject_counts,
        payload_bytes=sum(o.record.payload_bytes for o in outcomes),
        bytes=sum(o.record.bytes for o in outcomes),
        seconds=time.monotonic() - started,
        notes=list(meta.notes),
        published=True,
        phases=clock.phases,
    )


class _PhaseClock:
    """Wall seconds per named phase, each measured from the previous mark."""

    def __init__(self, started: float) -> None:
        self.last = started
        self.phases: dict[str, float] = {}

    def mark(self, name: str) -> None:
        now = time.monotonic()
        self.phases[name] = now - self.last
        self.last = now


def _run(options: PipelineOptions, build: Callable[[beam.Pipeline], object]) -> None:
    """Build and run one pipeline to completion; close a Dask client the runner opened."""
    pipeline = beam.Pipeline(runner=make_runner(options), options=options)
    build(pipeline)
    result = pipeline.run()
    try:
        state = result.wait_until_finish()
    finally:
        client = getattr(result, "client", None)  # DaskRunnerResult holds its distributed.Client
        if client is not None:
            client.close()
    if state is not None and state != PipelineState.DONE:
        raise ShardfeedError(f"the Beam pipeline ended in state {state}; nothing was published")


def _file_bytes(graph: GraphConfig, file: str) -> int:
    return int(
        pc.sum(read_totals(graph.part("totals", file, UNIT_SUFFIX)).column("bytes")).as_py() or 0
    )


def _unit_sizes(graph: GraphConfig, file: str) -> tuple[np.ndarray, np.ndarray]:
    """(payload bytes, rows) of one file's units, in source order."""
    return read_unit_sizes(graph.part("units", file, UNIT_SUFFIX))


def _read_totals(graph: GraphConfig, files: Sequence[str]) -> list[BucketTotal]:
    """Merge every file's bucket totals one file at a time into dense per-bucket arrays (plus a
    dict for oversized units' own buckets): memory is bounded by the bucket count."""
    dense = np.zeros((3, FINE_BUCKETS), dtype=np.int64)  # units, rows, bytes
    big: dict[int, BucketTotal] = {}
    for file in files:
        table = read_totals(graph.part("totals", file, UNIT_SUFFIX))
        buckets = table.column("bucket").to_numpy()
        values = np.stack([table.column(n).to_numpy() for n in ("units", "rows", "bytes")])
        small = buckets < FINE_BUCKETS
        for k in range(3):
            np.add.at(dense[k], buckets[small].astype(np.int64), values[k][small])
        for b, u, r, n in zip(buckets[~small].tolist(), *values[:, ~small].tolist(), strict=True):
            total = BucketTotal(b, u, r, n)
            big[b] = big[b] + total if b in big else total
    used = np.flatnonzero(dense[0])
    return [
        *totals_from_arrays(used, dense[0][used], dense[1][used], dense[2][used]),
        *big.values(),
    ]


def _merge_inferred(source: SourceReader, graph: GraphConfig, files: Sequence[str]) -> Any:
    """Merge the per-file inference parts in file order (the merge is associative and commutative)."""
    merged = None
    for file in files:
        part = read_inferred(source, graph.part("infer", file, ".json"))
        merged = part if merged is None else type(source).merge_inferred(merged, part)
    return merged


def _only_leftovers(dst: str) -> bool:
    """A DST holding an interrupted run's leftovers (work dir, no manifest) may be taken over."""
    return os.path.isdir(os.path.join(dst, WORK_DIR)) and not os.path.exists(
        os.path.join(dst, MANIFEST_PATH)
    )


def _keep_finished_shards(dst: str, work: str) -> None:
    """Take over an interrupted run's DST: its shard files stay, and its sidecars move aside to
    ``previous-shards/``, where each writer checks whether its shard is already done
    (:func:`~shardfeed.pipelines.convert.reusable_outcome`); the rest of the work dir is redone."""
    previous = os.path.join(work, PREVIOUS)
    os.makedirs(previous, exist_ok=True)
    finished = os.path.join(work, "shards")
    if os.path.isdir(finished):
        for name in os.listdir(finished):
            os.replace(os.path.join(finished, name), os.path.join(previous, name))
    for name in os.listdir(work):
        if name != PREVIOUS:
            shutil.rmtree(os.path.join(work, name), ignore_errors=True)
    shutil.rmtree(os.path.join(dst, "meta"), ignore_errors=True)


def _remove_unplanned(dst: str, outcomes: Sequence[ShardOutcome]) -> None:
    """Delete data and video files this run did not write (an interrupted run's other shards,
    temporary files), so the published tree holds exactly what the manifest lists."""
    keep = {r.path for o in outcomes for r in (o.record, *getattr(o, "files", ()))}
    for top in LISTED_DIRS:
        for directory, _, names in os.walk(os.path.join(dst, top)):
            for name in names:
                path = os.path.join(directory, name)
                if os.path.relpath(path, dst).replace(os.sep, "/") not in keep:
                    os.unlink(path)


def _read_outcomes(work: str) -> list[ShardOutcome]:
    directory = os.path.join(work, "shards")
    if not os.path.isdir(directory):
        return []
    outcomes = []
    for name in sorted(os.listdir(directory)):
        if name.endswith(".json") and not name.startswith("."):
            with open(os.path.join(directory, name), encoding="utf-8") as handle:
                outcomes.append(ShardOutcome.from_state(json.load(handle)["outcome"]))
    return outcomes


def _collect_rejects(work: str) -> tuple[list[str], dict[str, int]]:
    directory = os.path.join(work, "rejects")
    names = (
        sorted(n for n in os.listdir(directory) if n.endswith(".jsonl") and not n.startswith("."))
        if os.path.isdir(directory)
        else []
    )
    counts: dict[str, int] = {}
    for name in names:
        with open(os.path.join(directory, name), encoding="utf-8") as handle:
            for line in handle:
                reject = RejectRecord.from_json(json.loads(line))
                counts[reject.reason] = counts.get(reject.reason, 0) + 1
    return names, counts


def _move_rejects(dst: str, work: str, names: list[str]):
    records = []
    target = os.path.join(dst, REJECTS_DIR)
    for name in names:
        os.makedirs(target, exist_ok=True)
        os.replace(os.path.join(work, "rejects", name), os.path.join(target, name))
        records.append(file_record(dst, f"{REJECTS_DIR}/{name}"))
    return records
