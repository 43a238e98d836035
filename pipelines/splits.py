"""``convert --split NAME=SRC ... DST``: one dataset whose named splits are contiguous runs of shards.

Each split runs the ordinary conversion graph (:class:`~shardfeed.pipelines.convert.ConvertFiles`)
on its own source, in its own work dir (``.shardfeed-work/split-NAME``): its units are scanned,
shuffled, planned and balanced by themselves, so no shard mixes splits. The splits run one after
another because each numbers its shards, rows and episodes on from the previous splits'
(``GraphConfig.shard_offset``, ``row_offset``, ``unit_offset``). A schema-inferring source (JSONL,
Parquet, ...) infers one schema over every split's files first. The driver then publishes one
dataset from all the shards, in split order, recording each split's range in ``info.json`` and the
manifest (``publish(..., splits=...)``).
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Sequence

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

from shardfeed.formats.cost import resolve_cost_kind
from shardfeed.formats.manifest_commit import commit_manifest, dataset_version
from shardfeed.formats.publish import DatasetOptions, ShardOutcome, prepare_root, publish
from shardfeed.formats.sources import detect_kind
from shardfeed.formats.store_path import StorePath
from shardfeed.formats.writer_lease import WriterLease
from shardfeed.pipelines.convert import ConvertFiles, InferSchema
from shardfeed.pipelines.driver import (
    ConvertConfig,
    ConvertSummary,
    SidecarReload,
    _PhaseClock,
    _run,
    checked_outcomes,
    keep_finished_shards,
    mark_interrupted,
    move_rejects,
    only_leftovers,
    remove_unplanned,
)
from shardfeed.pipelines.graph_config import GraphConfig
from shardfeed.pipelines.plan_stage import PlanSettings, read_plan_info
from shardfeed.pipelines.progress import WorkDirProgress
from shardfeed.pipelines.spec_stage import merge_inferred
from shardfeed.schemas.errors import SchemaError, ShardfeedError
from shardfeed.schemas.manifest import Rejects, check_split_name


def check_splits(splits: Sequence[tuple[str, str]]) -> None:
    """Valid, distinct split names, each with its own source."""
    names = [name for name, _ in splits]
    for name in names:
        try:
            check_split_name(name, "--split")
        except SchemaError as err:
            raise ShardfeedError(str(err)) from None
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ShardfeedError(f"--split names must be distinct; {repeated} given more than once")
    sources = [os.path.abspath(src).rstrip("/") for _, src in splits]
    shared = sorted({s for s in sources if sources.count(s) > 1})
    if shared:
        raise ShardfeedError(f"each --split needs its own SRC; {shared} is given twice")


def run_split_convert(
    config: ConvertConfig, beam_args: Sequence[str] = (), lease: WriterLease | None = None
) -> ConvertSummary:
    """Convert every ``config.splits`` source into one published dataset at ``config.dst``;
    the manifest is committed only while ``lease`` (DST's writer lease) is held."""
    started = time.monotonic()
    clock = _PhaseClock(started)
    check_splits(config.splits)
    if config.hot_weights is not None:
        raise ShardfeedError("--hot-weights cannot be combined with --split")
    if config.dedup:
        raise ShardfeedError("--dedup cannot be combined with --split yet")
    if any("://" in path for path in (config.dst, *(src for _, src in config.splits))):
        raise ShardfeedError("--split works on local paths only (no s3:// SRC or DST yet)")
    names = [name for name, _ in config.splits]
    kind = config.kind
    if kind is None:
        kinds = {name: detect_kind(src) for name, src in config.splits}
        if len(set(kinds.values())) > 1:
            raise ShardfeedError(
                f"the splits are of different kinds {kinds}; one dataset needs one (or pass --from)"
            )
        kind = kinds[names[0]]
    sources = [config.open_source(src, kind) for _, src in config.splits]
    metas = [source.meta() for source in sources]
    meta = metas[0]
    for name, other in zip(names[1:], metas[1:], strict=True):
        if (other.tasks, other.fps, other.robot_type) != (meta.tasks, meta.fps, meta.robot_type):
            raise ShardfeedError(
                f"split {name!r}: its tasks, fps or robot type differ from split {names[0]!r}'s; "
                "the splits of one dataset share them"
            )
    dst_path = StorePath.of(config.dst)
    dst = dst_path.local
    work = GraphConfig(dst=dst_path, seed=0, options=DatasetOptions()).work
    takeover = only_leftovers(dst_path, work) and not config.overwrite
    replaced = dataset_version(dst_path) if config.overwrite else None
    if config.overwrite:  # a kill while the old dataset goes leaves a DST to take over
        mark_interrupted(dst_path, work)
    if not takeover:
        prepare_root(dst, config.overwrite)
    source = ",".join(
        f"{name}={os.path.basename(os.path.abspath(src).rstrip('/'))}"
        for name, src in config.splits
    )
    options = config.dataset_options(meta, kind, source)
    seed = config.shuffle_seed or 0
    top = GraphConfig(dst=dst_path, seed=seed, options=options)
    if takeover:  # split sidecars are not reused; shards are rewritten
        keep_finished_shards(dst_path, top.work)
    else:
        top.work.rmtree()
    files = [source.files() for source in sources]
    pipeline_options = PipelineOptions(list(beam_args))
    clock.mark("open")

    # 0. one schema over every split's files (one pipeline, a branch per split)
    inferred = None
    if hasattr(sources[0], "infer"):
        graphs = [GraphConfig(dst=dst_path, seed=seed, options=options, split=n) for n in names]

        def infer_all(p: beam.Pipeline) -> None:
            for name, source, graph, split_files in zip(names, sources, graphs, files, strict=True):
                _ = (
                    p
                    | f"ListFiles[{name}]" >> beam.Create(split_files, reshuffle=False)
                    | f"InferSchema[{name}]" >> InferSchema(source, graph)
                )

        _run(pipeline_options, infer_all)
        for source, graph, split_files in zip(sources, graphs, files, strict=True):
            part = merge_inferred(source, graph.work, split_files)
            if part is not None:
                inferred = part if inferred is None else type(source).merge_inferred(inferred, part)
        clock.mark("infer")
    spec = sources[0].spec(inferred)
    for name, source in zip(names[1:], sources[1:], strict=True):
        if source.spec(inferred).to_json() != spec.to_json():
            raise ShardfeedError(
                f"split {name!r}: its features differ from split {names[0]!r}'s; "
                "the splits of one dataset share one schema"
            )
    resolve_cost_kind(spec, config.cost)

    settings = PlanSettings(
        config.target_shard_bytes, config.shuffle_seed is not None, config.max_reject_fraction
    )
    outcomes: list[ShardOutcome] = []
    reload = SidecarReload()
    shard_counts: list[tuple[str, int]] = []
    rejects: Counter[str] = Counter()
    extra = []
    phases = {"scan": 0.0, "plan": 0.0, "write": 0.0}
    rows = units = 0
    for name, source, split_files in zip(names, sources, files, strict=True):
        graph = GraphConfig(
            dst=dst_path,
            seed=seed,
            options=options,
            split=name,
            sort_spools=config.shuffle_seed is not None,
            piece_bytes=config.task_bytes,
            shard_offset=len(outcomes),
            row_offset=rows,
            unit_offset=units,
        )
        for leftover in ("shards", "units", "totals", "rejects", "hot"):  # keep the infer parts
            (graph.work / leftover).rmtree()
        pipeline_started = time.time()
        with WorkDirProgress(graph.work, len(split_files), enabled=config.progress):
            _run(
                pipeline_options,
                lambda p, source=source, graph=graph, split_files=split_files: (
                    p
                    | "ListFiles" >> beam.Create(split_files, reshuffle=False)
                    | "Convert" >> ConvertFiles(source, spec, graph, settings)
                ),
            )
        planned = read_plan_info(graph.work)
        if planned is None:
            raise ShardfeedError(
                f"split {name!r}: the runner finished without planning any shard; nothing was published"
            )
        phases["scan"] += max(0.0, planned.started - pipeline_started)
        phases["plan"] += max(0.0, planned.finished - planned.started)
        phases["write"] += max(0.0, time.time() - planned.finished)
        written = checked_outcomes(
            planned, graph.work, config.max_reject_fraction, label=f"split {name!r}: "
        )
        if not written:
            raise ShardfeedError(f"split {name!r} holds no samples; every split needs some")
        outcomes.extend(written)
        reload.add(graph, written)
        shard_counts.append((name, len(written)))
        rows += sum(o.record.rows for o in written)
        units += planned.planned_units
        rejects.update(planned.reject_counts)
        extra.extend(move_rejects(dst, graph.work, planned.reject_files))
    clock.split(*phases.items())
    remove_unplanned(dst_path, outcomes)
    reject_counts = dict(sorted(rejects.items()))
    rejected = sum(reject_counts.values())
    publish(
        dst,
        spec,
        outcomes,
        options,
        rejects=Rejects(rejected, reject_counts),
        extra_files=extra,
        splits=shard_counts,  # stats merge here, in shard order, over every split's shards
        reload=reload,
        commit=lambda body: commit_manifest(dst_path, body, lease, top.work),
    )
    top.work.rmtree()
    clock.mark("publish")
    return ConvertSummary(
        dst=dst,
        samples_in=rows + rejected,
        samples_out=rows,
        shards=len(outcomes),
        rejects=reject_counts,
        payload_bytes=sum(o.record.payload_bytes for o in outcomes),
        bytes=sum(o.record.bytes for o in outcomes),
        seconds=time.monotonic() - started,
        notes=[*(["replaced the published " + replaced] if replaced else []), *meta.notes],
        published=True,
        phases=clock.phases,
    )
