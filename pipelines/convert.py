"""The conversion graph. Payload bytes never cross a Beam shuffle, and no stage needs a side input,
so every runner (in-process, Dask, Flink, ...) sees the same plain Map/GroupByKey graph.

``ConvertFiles`` is one pipeline of three steps:

1. ``ScanFiles``: source file -> its unit table, bucket totals and rejects, written under the work dir.
2. ``PlanShards``: every scanned file meets in one GroupByKey; ``plan_stage.plan_files`` plans shards
   from the small totals (``shardfeed.planning.shard_plan``) and saves the plan under the work dir.
3. ``WriteShards``: unit table -> (shard, units) -> GroupByKey -> each shard writer reads its own
   units from the source, writes the shard and a JSON sidecar. The driver publishes from the sidecars.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import apache_beam as beam
import numpy as np
import pyarrow as pa

from shardfeed.formats.atomic import atomic_write_bytes
from shardfeed.formats.publish import DatasetOptions, ShardOutcome, add_videos, build_shard
from shardfeed.formats.shard_writer import SHARD_WRITER_VERSION
from shardfeed.formats.sources.base import ScanResult, SourceReader, SpoolingSource, UnitRef
from shardfeed.formats.spool import SPOOL_SUFFIX, SpoolWriter, gather, take_spooled, unit_rows
from shardfeed.formats.unit_table import (
    UNIT_SUFFIX,
    KeyedUnit,
    read_unit_group,
    read_unit_table,
    work_part,
    write_totals,
    write_unit_groups,
    write_units,
)
from shardfeed.pipelines.dedup import DropDuplicates
from shardfeed.pipelines.plan_stage import Plan, PlanSettings, hot_positions, load_plan, plan_files
from shardfeed.pipelines.stats_combine import MergeShardStats, StatsState, save_merged_stats
from shardfeed.planning.shard_plan import ContiguousPlan, ShardPlan, bucket_of, hot_bucket
from shardfeed.schemas.errors import ShardfeedError
from shardfeed.schemas.features import FeatureSpec
from shardfeed.schemas.manifest import canonical_json
from shardfeed.transforms.hashing import shuffle_key

WORK_DIR = ".shardfeed-work"  # under DST while a run is in flight; removed after publishing
PREVIOUS = "previous-shards"  # sidecars of an interrupted run, under WORK_DIR, checked for reuse


@dataclass(frozen=True)
class GraphConfig:
    dst: str
    seed: int
    options: DatasetOptions
    #: one named split of ``convert --split``: its work dir is ``WORK_DIR/split-NAME``, and its
    #: shards, rows and episodes are numbered on from the previous splits'
    split: str | None = None
    shard_offset: int = 0
    row_offset: int = 0
    unit_offset: int = 0
    work: str = field(init=False)

    def __post_init__(self) -> None:
        work = os.path.join(self.dst, WORK_DIR)
        if self.split is not None:
            work = os.path.join(work, f"split-{self.split}")
        object.__setattr__(self, "work", work)

    def sidecar(self, number: int, *, previous: bool = False) -> str:
        """Work path of shard ``number``'s JSON sidecar (its outcome and the digest of its inputs);
        ``previous``: the one an interrupted earlier run left, which this run may reuse."""
        return os.path.join(self.work, PREVIOUS if previous else "shards", f"{number:06d}.json")

    def part(self, kind: str, source_file: str, suffix: str) -> str:
        """Work path of one source file's part (units, totals, rejects), named by a stable hash."""
        return work_part(self.work, kind, source_file, suffix)


def infer_file(file: str, source: SourceReader, config: GraphConfig) -> str:
    """source file -> its schema-inference part as JSON (sources whose schema comes from the data)."""
    part = dataclasses.asdict(source.infer(file))
    atomic_write_bytes(
        config.part("infer", file, ".json"),
        json.dumps(part, sort_keys=True).encode(),
        durable=False,  # scratch: a re-run infers again
    )
    return file


def read_inferred(source: SourceReader, path: str) -> Any:
    """Rebuild one inference part (a dataclass of JSON values; never unpickled)."""
    with open(path, encoding="utf-8") as handle:
        return source.inferred_type(**json.load(handle))


def scan_file(file: str, source: SourceReader, spec: FeatureSpec, config: GraphConfig) -> str:
    """source file -> its unit table, bucket totals and (if any) sorted rejects; returns ``file``.

    A spooling source's rows go to the file's spool as they are decoded (``formats/spool.py``)."""
    if isinstance(source, SpoolingSource):
        result = _scan_spooled(file, source, spec, config)
    else:
        result = source.scan(file, spec)
    target = config.options.target_shard_bytes
    units = []
    for ref in result.units:
        key = shuffle_key(config.seed, ref.content_hash, f"{ref.file}:{ref.position}")
        units.append(KeyedUnit(key, bucket_of(key, ref.payload_bytes, target), ref))
    write_units(config.part("units", file, UNIT_SUFFIX), units)
    write_totals(config.part("totals", file, UNIT_SUFFIX), units)
    if result.rejects:
        ordered = sorted(
            result.rejects, key=lambda r: (_position_key(r.position), r.reason, r.message)
        )
        body = "".join(r.dumps() + "\n" for r in ordered).encode()
        atomic_write_bytes(config.part("rejects", file, ".jsonl"), body)
    beam.metrics.Metrics.counter("shardfeed", "files").inc()
    beam.metrics.Metrics.counter("shardfeed", "units").inc(len(units))
    return file


def _scan_spooled(
    file: str, source: SpoolingSource, spec: FeatureSpec, config: GraphConfig
) -> ScanResult:
    """Scan ``file`` part by part, appending its rows to its spool; each unit's locator is its
    first row there."""
    result = ScanResult()
    with SpoolWriter(config.part("spool", file, SPOOL_SUFFIX), spec.arrow_schema()) as spool:
        for part in source.scan_rows(file, spec):
            first = spool.rows
            spool.write(part.table)
            starts = first + np.cumsum(part.rows) - part.rows
            for position, rows, payload, digest, start in zip(
                part.positions.tolist(),
                part.rows.tolist(),
                part.payload.tolist(),
                part.hashes,
                starts.tolist(),
                strict=True,
            ):
                result.units.append(UnitRef(file, position, rows, payload, digest, (start,)))
            result.rejects.extend(part.rejects)
    return result


def read_spooled(units: Sequence[KeyedUnit], spec: FeatureSpec, config: GraphConfig) -> pa.Table:
    """The rows of ``units``, in the given order, from their files' spools."""
    by_file: dict[str, list[int]] = {}
    for i, unit in enumerate(units):
        by_file.setdefault(unit.ref.file, []).append(i)
    counts = np.array([u.ref.rows for u in units], np.int64)
    firsts = np.cumsum(counts) - counts  # each unit's first row in the shard
    schema = spec.arrow_schema()
    pieces = []
    for file in sorted(by_file):
        picked = np.array(by_file[file], np.int64)
        starts = np.array([units[i].ref.locator[0] for i in picked.tolist()], np.int64)
        path = config.part("spool", file, SPOOL_SUFFIX)
        table = take_spooled(path, starts, counts[picked], schema)
        pieces.append((table, unit_rows(firsts[picked], counts[picked])))
    return gather(pieces, int(counts.sum()))


def keyed_by_shard(file: str, config: GraphConfig) -> Iterable[tuple[int, tuple[str, int]]]:
    """source file -> (shard, (file, group)) for each shard that gets units of the file.

    The file's units are rewritten grouped by shard (work dir ``byshard/``, one record batch per
    shard, source order within it), and only these references cross the shuffle. The in-process
    runner holds a whole GroupByKey in memory as Python objects (about 500 bytes per unit tuple),
    so shipping the units themselves made a run's memory grow with the corpus.
    """
    plan = load_plan(config.work)
    table = read_unit_table(config.part("units", file, UNIT_SUFFIX))
    if table.num_rows == 0:
        return
    if isinstance(plan, ContiguousPlan):
        shards = plan.shards_of(file, table.column("payload_bytes").to_numpy())
    else:
        hot = set(hot_positions(config.work, file).tolist())  # hot units move to hot buckets
        buckets, positions = (table.column(c).to_pylist() for c in ("bucket", "position"))
        shards = [
            plan.shard_of[hot_bucket(b) if p in hot else b]
            for b, p in zip(buckets, positions, strict=True)
        ]
    shards = np.asarray(shards, dtype=np.int64)
    order = np.argsort(shards, kind="stable")
    numbers, starts = np.unique(shards[order], return_index=True)
    write_unit_groups(config.part("byshard", file, UNIT_SUFFIX), table, np.split(order, starts[1:]))
    for group, shard in enumerate(numbers.tolist()):
        yield shard, (file, group)


def write_planned_shard(
    item: tuple[int, Iterable[tuple[str, int]]],
    source: SourceReader,
    spec: FeatureSpec,
    config: GraphConfig,
) -> tuple[int, StatsState]:
    """(shard number, units) -> the shard file under DST plus its JSON sidecar; returns the shard's
    number and stats, for :class:`~shardfeed.pipelines.stats_combine.MergeShardStats`."""
    local, parts = item  # the shard's number in this plan; a split's shards number on
    number = config.shard_offset + local
    plan = load_plan(config.work)
    row_start = config.row_offset + plan.row_start[local]
    unit_start = config.unit_offset + plan.unit_start[local]
    units = [
        KeyedUnit.from_tuple(unit)
        for file, group in parts
        for unit in read_unit_group(config.part("byshard", file, UNIT_SUFFIX), group)
    ]
    # shuffled: by stable key; source order: files() is sorted, so (file, position) is source order
    shuffled = isinstance(plan, ShardPlan)
    ordered = sorted(
        units, key=KeyedUnit.sort_key if shuffled else lambda u: (u.ref.file, u.ref.position)
    )
    sidecar = config.sidecar(number)
    inputs = shard_inputs_digest(local, ordered, source, spec, plan, config)
    reused = reusable_outcome(config.dst, config.sidecar(number, previous=True), inputs)
    if reused is not None:  # an interrupted run already wrote exactly this shard
        _write_sidecar(sidecar, inputs, reused)
        beam.metrics.Metrics.counter("shardfeed", "shards_reused").inc()
        return number, _stats_state(reused)
    if isinstance(source, SpoolingSource):
        table = read_spooled(ordered, spec, config)
    else:
        table = source.read([u.ref for u in ordered], spec)
    table = renumber(table, spec, [u.ref.rows for u in ordered], row_start, unit_start)
    episodic = "episode_index" in spec
    outcome = build_shard(
        config.dst,
        number,
        table,
        spec,
        config.options,
        index_start=row_start,
        source_episode_ids=[u.ref.position for u in ordered] if episodic else None,
    )
    outcome = add_videos(outcome, config.dst, source, [u.ref for u in ordered])  # MP4s, if any
    _write_sidecar(sidecar, inputs, outcome)
    beam.metrics.Metrics.counter("shardfeed", "shards").inc()
    beam.metrics.Metrics.counter("shardfeed", "bytes").inc(outcome.record.bytes)
    return number, _stats_state(outcome)


def _stats_state(outcome: ShardOutcome) -> StatsState:
    return {name: stats.to_state() for name, stats in outcome.stats.items()}


def _write_sidecar(path: str, inputs: str, outcome: ShardOutcome) -> None:
    state = {"inputs": inputs, "outcome": outcome.to_state()}
    atomic_write_bytes(path, json.dumps(state, separators=(",", ":")).encode())


def shard_inputs_digest(
    number: int,
    ordered: Sequence[KeyedUnit],
    source: SourceReader,
    spec: FeatureSpec,
    plan: Plan,
    config: GraphConfig,
) -> str:
    """sha256 of everything a shard's bytes depend on: its units in order (with their content
    hashes), the media files it cuts videos from, where its rows and episodes start, the spec and
    the dataset options. ``number`` is the shard's number in ``plan`` (a split's offsets apply)."""
    h = hashlib.sha256()
    head = {
        "number": config.shard_offset + number,
        "row_start": config.row_offset + int(plan.row_start[number]),
        "unit_start": config.unit_offset + int(plan.unit_start[number]),
        "spec": spec.to_json(),
        "options": dataclasses.asdict(config.options),
        # a shard written by another shard writer (another layout or checks) is not reused
        "writer": SHARD_WRITER_VERSION,
    }
    h.update(canonical_json(head).encode())
    for unit in ordered:
        ref = unit.ref
        line = f"\n{ref.file}\0{ref.position}\0{ref.rows}\0{ref.payload_bytes}\0{ref.content_hash}"
        h.update(line.encode())
    if hasattr(source, "video_inputs"):
        for line in source.video_inputs([u.ref for u in ordered]):
            h.update(f"\n{line}".encode())
    return h.hexdigest()


def reusable_outcome(dst: str, sidecar: str, inputs: str) -> ShardOutcome | None:
    """The outcome an earlier, interrupted run recorded for the same shard inputs, if every file it
    names is still whole (size and sha256 re-checked); else None and the shard is written anew.

    A sidecar from an older shardfeed, without the shard's row sizes or costs, is never reused."""
    try:
        with open(sidecar, encoding="utf-8") as handle:
            state = json.load(handle)
        if (
            state.get("inputs") != inputs
            or not {"row_bytes", "row_cost"} <= state["outcome"].keys()
        ):
            return None
        outcome = ShardOutcome.from_state(state["outcome"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError, ShardfeedError):
        return None
    records = [outcome.record, *getattr(outcome, "files", ())]  # the shard, and its videos if any
    if not all(_file_matches(os.path.join(dst, r.path), r.bytes, r.sha256) for r in records):
        return None
    return outcome


def _file_matches(path: str, size: int, sha256: str) -> bool:
    try:
        with open(path, "rb") as handle:
            if os.fstat(handle.fileno()).st_size != size:
                return False
            return hashlib.file_digest(handle, "sha256").hexdigest() == sha256
    except OSError:
        return False


def renumber(
    table: pa.Table, spec: FeatureSpec, unit_rows: Sequence[int], row_start: int, unit_start: int
) -> pa.Table:
    """Rewrite ``index`` to run on from ``row_start`` and ``episode_index`` from ``unit_start``.

    Episodes are renumbered in output order (LeRobot reads ``index`` as the file-order position).
    """
    columns = {}
    if "index" in spec:
        columns["index"] = pa.array(
            np.arange(row_start, row_start + table.num_rows, dtype=np.int64)
        )
    if "episode_index" in spec:
        ids = np.repeat(
            np.arange(unit_start, unit_start + len(unit_rows), dtype=np.int64), unit_rows
        )
        columns["episode_index"] = pa.array(ids)
    for name, array in columns.items():
        position = table.schema.get_field_index(name)
        field_ = table.schema.field(position)
        table = table.set_column(position, field_, array.cast(field_.type))
    return table


class InferSchema(beam.PTransform):
    """file paths -> the same paths, once each file's inference part is written."""

    def __init__(self, source: SourceReader, config: GraphConfig) -> None:
        super().__init__()
        self.source, self.config = source, config

    def expand(self, files: beam.PCollection) -> beam.PCollection:
        return (
            files
            | "Spread" >> beam.Reshuffle()
            | "Infer" >> beam.Map(infer_file, self.source, self.config)
        )


class ScanFiles(beam.PTransform):
    """file paths -> the same paths, once each file's units, totals and rejects are written."""

    def __init__(self, source: SourceReader, spec: FeatureSpec, config: GraphConfig) -> None:
        super().__init__()
        self.source, self.spec, self.config = source, spec, config

    def expand(self, files: beam.PCollection) -> beam.PCollection:
        return (
            files
            | "Spread" >> beam.Reshuffle()
            | "Scan" >> beam.Map(scan_file, self.source, self.spec, self.config)
        )


class PlanShards(beam.PTransform):
    """scanned file paths -> the same paths once the plan is saved (none above the reject limit);
    ``source`` names units for hot weights."""

    def __init__(self, config: GraphConfig, settings: PlanSettings, source: SourceReader) -> None:
        super().__init__()
        self.config, self.settings, self.source = config, settings, source

    def expand(self, files: beam.PCollection) -> beam.PCollection:
        return (
            files
            | "OneKey" >> beam.Map(_under_one_key)
            # (0, [every scanned file]): waits for the whole scan
            | "AllScanned" >> beam.GroupByKey()
            | "Plan" >> beam.FlatMap(plan_files, self.config.work, self.settings, self.source)
        )


class WriteShards(beam.PTransform):
    """file paths -> (shard number, stats) per shard written: each shard is written from its own
    unit references, following the plan saved under the work dir."""

    def __init__(self, source: SourceReader, spec: FeatureSpec, config: GraphConfig) -> None:
        super().__init__()
        self.source, self.spec, self.config = source, spec, config

    def expand(self, files: beam.PCollection) -> beam.PCollection:
        return (
            files
            | "Spread" >> beam.Reshuffle()
            # (shard, (file, group)) per source file and shard: the units stay on disk
            | "KeyByShard" >> beam.FlatMap(keyed_by_shard, self.config)
            | "GroupByShard" >> beam.GroupByKey()
            # (shard, [(file, group), ...]) -> rows written
            | "WriteShard" >> beam.Map(write_planned_shard, self.source, self.spec, self.config)
        )


class ConvertFiles(beam.PTransform):
    """source file paths -> the merged stats, saved: scan, plan, write and summarise, one pipeline."""

    def __init__(
        self, source: SourceReader, spec: FeatureSpec, config: GraphConfig, settings: PlanSettings
    ) -> None:
        super().__init__()
        self.source, self.spec, self.config, self.settings = source, spec, config, settings

    def expand(self, files: beam.PCollection) -> beam.PCollection:
        scanned = files | "ScanFiles" >> ScanFiles(self.source, self.spec, self.config)
        if self.settings.dedup:  # the same paths, once later exact copies are out of the tables
            scanned = scanned | "DropDuplicates" >> DropDuplicates(self.source, self.config)
        return (
            scanned
            | "PlanShards" >> PlanShards(self.config, self.settings, self.source)
            | "WriteShards" >> WriteShards(self.source, self.spec, self.config)
            # without_defaults: no side input (DaskRunner), and no output when nothing was written
            | "MergeStats" >> beam.CombineGlobally(MergeShardStats()).without_defaults()
            | "SaveStats" >> beam.Map(save_merged_stats, self.config.work)
        )


def _under_one_key(file: str) -> tuple[int, str]:
    return 0, file


def _position_key(position: str) -> tuple[str, int, str]:
    kind, _, rest = position.partition(":")
    return (kind, int(rest), "") if rest.isdigit() else (kind, -1, rest)
