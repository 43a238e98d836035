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

import contextlib
import dataclasses
import hashlib
import json
import threading
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from apache_beam.typehints.decorators import no_annotations

from shardfeed.formats.publish import ShardOutcome, add_videos, build_shard
from shardfeed.formats.shard_writer import SHARD_WRITER_VERSION
from shardfeed.formats.sources.base import (
    InferringSource,
    RowsScan,
    SourceReader,
    SplittableSource,
    StampedInputs,
    UnitRef,
)
from shardfeed.formats.store_path import StorePath
from shardfeed.formats.unit_table import (
    UNIT_SUFFIX,
    locator_texts,
    read_unit_group,
    read_unit_table,
    unit_refs,
    unit_table,
    write_totals,
    write_unit_groups,
    write_unit_table,
)
from shardfeed.pipelines.dedup import DropDuplicates
from shardfeed.pipelines.graph_config import (
    GraphConfig,
)
from shardfeed.pipelines.heap_trim import trim_c_heap
from shardfeed.pipelines.plan_stage import Plan, PlanSettings, hot_positions, load_plan, plan_files
from shardfeed.pipelines.spec_stage import (
    PieceTuple,
    confirm_spec,
    decide_guess,
    decide_spec,
    load_guess,
    load_spec,
    piece_name,
    save_inferred,
    save_part,
    save_sample,
)
from shardfeed.pipelines.spool_stage import (
    UnitArrays,
    read_units,
    scan_into_spool,
    spools,
    unit_keys,
)
from shardfeed.pipelines.spread import Spread
from shardfeed.pipelines.stats_combine import MergeShardStats, StatsState, save_merged_stats
from shardfeed.pipelines.worker_guard import guard_worker
from shardfeed.planning.shard_plan import ContiguousPlan, ShardPlan, buckets_of, hot_buckets
from shardfeed.schemas.errors import ShardfeedError
from shardfeed.schemas.features import FeatureSpec
from shardfeed.schemas.manifest import FileRecord, canonical_json
from shardfeed.schemas.rejects import RejectRecord


@no_annotations  # a SourceReader is a Protocol, which Beam 2.78's type check cannot compare
def infer_file(file: str | PieceTuple, source: SourceReader, config: GraphConfig) -> str:
    """source file (or piece of one) -> the same, once its schema-inference part is saved
    (sources whose schema comes from the data)."""
    guard_worker()
    save_inferred(source, config.work, file)
    return file


@no_annotations  # a SourceReader is a Protocol, which Beam 2.78's type check cannot compare
def pieces_of(file: str, source: SplittableSource, piece_bytes: int) -> list[PieceTuple]:
    """source file -> its pieces (file, index, start, stop, first position still unknown)."""
    guard_worker()
    ranges = source.pieces(file, piece_bytes)
    return [(file, index, start, stop, -1) for index, (start, stop) in enumerate(ranges)]


@no_annotations  # a SourceReader is a Protocol, which Beam 2.78's type check cannot compare
def scan_file(
    file: str, source: SourceReader, spec: FeatureSpec | None, config: GraphConfig
) -> str:
    """source file -> its unit table, bucket totals and (if any) sorted rejects; returns ``file``.

    A spooling source's rows go to the file's spool as they are decoded (``formats/spool.py``).
    Keys, buckets and the tables are computed with array operations, not per unit. ``spec``
    None: the features the graph decided (``spec_stage``)."""
    guard_worker()
    _scan_whole(file, source, spec or load_spec(config.work), config)
    beam.metrics.Metrics.counter("shardfeed", "files").inc()
    return file


def _scan_whole(file: str, source: SourceReader, spec: FeatureSpec, config: GraphConfig) -> None:
    """Scan one whole file into its unit table, totals, rejects and (if it spools) its spool."""
    spooled = spools(source, file)
    if spooled:
        columns, rejects, keys = scan_into_spool(
            file, 0, source.scan_rows(file, spec), spec, config
        )
    else:
        result = source.scan(file, spec)
        columns, rejects, keys = _ref_columns(file, result.units), result.rejects, None
    _save_scan(file, file, columns, rejects, spooled, config, keys)


@no_annotations  # a SourceReader is a Protocol, which Beam 2.78's type check cannot compare
def scan_piece(
    piece: PieceTuple, source: SplittableSource, spec: FeatureSpec | None, config: GraphConfig
) -> tuple[str, int]:
    """One piece of a file -> (file, piece index), once the piece's unit table, totals, rejects
    and spool are written under its own part name; ``merge_pieces`` joins them per file."""
    guard_worker()
    file, index, start, stop, first = piece
    spec = spec or load_spec(config.work)
    whole = (start, stop) == (0, -1)  # the file's only piece: no joining needed
    if whole:  # as an unsplit file (a plain tar is then read again by seeking, not spooled)
        _scan_whole(file, source, spec, config)
        return file, index
    _spool_piece(piece, source.scan_piece(file, spec, start, stop, first), spec, config)
    return file, index


def _spool_piece(
    piece: PieceTuple, rows: Iterable[RowsScan], spec: FeatureSpec, config: GraphConfig
) -> None:
    """Spool a piece's rows and save its unit table, totals and rejects (a whole file's under
    the file's own name)."""
    file, index, start, stop, _ = piece
    whole = (start, stop) == (0, -1)
    columns, rejects, keys = scan_into_spool(file, 0 if whole else index, rows, spec, config)
    _save_scan(_part_of(piece), file, columns, rejects, True, config, keys)


def _part_of(piece: PieceTuple) -> str:
    """The name a piece's scan parts are saved under: a whole file's own, or the piece's."""
    file, index, start, stop, _ = piece
    return file if (start, stop) == (0, -1) else piece_name(file, index)


@no_annotations  # a SourceReader is a Protocol, which Beam 2.78's type check cannot compare
def sample_piece(piece: PieceTuple, source: InferringSource, config: GraphConfig) -> PieceTuple:
    """piece -> the same, once the inference part of its head is saved (the guess's input)."""
    guard_worker()
    save_sample(source, config.work, piece)
    return piece


@no_annotations  # a SourceReader is a Protocol, which Beam 2.78's type check cannot compare
def scan_guessing(piece: PieceTuple, source: InferringSource, config: GraphConfig) -> PieceTuple:
    """numbered piece -> the same, once it is scanned typed to the guessed features (when there
    are any) and its share of inference, counted in the same pass, is saved."""
    guard_worker()
    file, _, start, stop, first = piece
    spec = load_guess(config.work)
    scan = source.scan_inferring(file, spec, start, stop, first)
    if spec is None:
        for _ in scan:  # counting only: the guess failed, so a second scan will type them
            pass
    else:
        _spool_piece(piece, scan, spec, config)
    save_part(config.work, piece, scan.inferred())
    return piece


@no_annotations  # a SourceReader is a Protocol, which Beam 2.78's type check cannot compare
def rescan_if_guessed_wrong(
    item: tuple[PieceTuple, bool], source: InferringSource, config: GraphConfig
) -> tuple[str, int]:
    """(piece, again) -> (file, piece index), once the piece is scanned again with the decided
    features when they are not the guess (its first scan's rejects removed first)."""
    guard_worker()
    piece, again = item
    file, index, start, stop, first = piece
    if again:
        spec = load_spec(config.work)
        config.part("rejects", _part_of(piece), ".jsonl").unlink()
        _spool_piece(piece, source.scan_inferring(file, spec, start, stop, first), spec, config)
    return file, index


def merge_pieces(item: tuple[str, Iterable[int]], config: GraphConfig) -> str:
    """(file, its piece indices) -> ``file``, once the pieces' unit tables, totals and rejects
    are joined into the file's own (positions are the file's, so the result is what one task
    scanning the whole file writes); the pieces' spools stay where the writers find them."""
    guard_worker()
    file, indices = item
    indices = sorted(indices)
    if indices == [0]:  # a file scanned whole wrote its own parts
        beam.metrics.Metrics.counter("shardfeed", "files").inc()
        return file
    names = [piece_name(file, index) for index in indices]
    tables = [read_unit_table(config.part("units", name, UNIT_SUFFIX)) for name in names]
    table = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
    write_unit_table(config.part("units", file, UNIT_SUFFIX), table)
    write_totals(config.part("totals", file, UNIT_SUFFIX), table)
    rejects = []
    for name in names:
        path = config.part("rejects", name, ".jsonl")
        try:
            lines = path.read_bytes().splitlines()
        except FileNotFoundError:
            lines = []
        rejects.extend(RejectRecord.from_json(json.loads(line)) for line in lines)
        for part in (path, *(config.part(kind, name, UNIT_SUFFIX) for kind in ("units", "totals"))):
            part.unlink()
    _save_rejects(file, rejects, config)
    beam.metrics.Metrics.counter("shardfeed", "files").inc()
    return file


def _save_scan(
    name: str,
    file: str,
    columns: UnitArrays,
    rejects: list[RejectRecord],
    spooled: bool,
    config: GraphConfig,
    keys: np.ndarray | None = None,
) -> None:
    """Write a scan's unit table, bucket totals and rejects under part name ``name`` (the
    file's, or a piece's); keys (unless the spool already computed them) and buckets are
    computed with array operations, not per unit."""
    positions, rows, payload, hashes, locators = columns
    if keys is None:
        keys, buckets = unit_keys(file, positions, hashes, payload, config)
    else:
        buckets = buckets_of(keys, payload, config.options.target_shard_bytes)
    table = unit_table(file, positions, rows, payload, hashes, locators, keys, buckets, spooled)
    write_unit_table(config.part("units", name, UNIT_SUFFIX), table)
    write_totals(config.part("totals", name, UNIT_SUFFIX), table)
    _save_rejects(name, rejects, config)
    beam.metrics.Metrics.counter("shardfeed", "units").inc(table.num_rows)
    pa.default_memory_pool().release_unused()  # the scan's decoded blocks (see write_planned_shard)


def _save_rejects(name: str, rejects: list[RejectRecord], config: GraphConfig) -> None:
    if rejects:
        ordered = sorted(rejects, key=lambda r: (_position_key(r.position), r.reason, r.message))
        body = "".join(r.dumps() + "\n" for r in ordered).encode()
        config.part("rejects", name, ".jsonl").write_bytes(body, durable=True)


def _ref_columns(file: str, refs: Sequence[UnitRef]) -> UnitArrays:
    """The arrays of a source that scans into :class:`UnitRef` objects."""
    for ref in refs:
        if ref.file != file:
            raise ValueError(f"scanning {file} gave a unit of {ref.file}")
    return (
        np.array([r.position for r in refs], np.int64),
        np.array([r.rows for r in refs], np.int64),
        np.array([r.payload_bytes for r in refs], np.int64),
        [r.content_hash for r in refs],
        locator_texts([r.locator for r in refs]),
    )


def keyed_by_shard(file: str, config: GraphConfig) -> Iterable[tuple[int, tuple[str, int]]]:
    """source file -> (shard, (file, group)) for each shard that gets units of the file.

    The file's units are rewritten grouped by shard (work dir ``byshard/``, one record batch per
    shard, source order within it), unless one shard takes them all (``WHOLE_FILE``: its writer
    reads the unit table itself), and only these references cross the shuffle. The in-process
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
        buckets = table.column("bucket").to_numpy()
        hot = np.isin(table.column("position").to_numpy(), hot_positions(config.work, file))
        if hot.any():  # hot units move to hot buckets
            buckets = np.where(hot, hot_buckets(buckets), buckets)
        shards = plan.shards_of(buckets)
    shards = np.asarray(shards, dtype=np.int64)
    order = np.argsort(shards, kind="stable")
    numbers, starts = np.unique(shards[order], return_index=True)
    if len(numbers) == 1:  # one shard takes the whole file: its writer reads the unit table
        yield int(numbers[0]), (file, WHOLE_FILE)
        return
    write_unit_groups(config.part("byshard", file, UNIT_SUFFIX), table, np.split(order, starts[1:]))
    for group, shard in enumerate(numbers.tolist()):
        yield shard, (file, group)


#: ``keyed_by_shard``'s group of a file whose units all go to one shard (contiguous plans, as
#: LeRobot's episodes and unshuffled runs have): no ``byshard/`` copy is written for it
WHOLE_FILE = -1


def _unit_group(config: GraphConfig, file: str, group: int) -> pa.Table:
    """The units of ``file`` that ``keyed_by_shard`` gave one shard as ``group``."""
    if group == WHOLE_FILE:
        return read_unit_table(config.part("units", file, UNIT_SUFFIX))
    return read_unit_group(config.part("byshard", file, UNIT_SUFFIX), group)


@no_annotations  # a SourceReader is a Protocol, which Beam 2.78's type check cannot compare
def write_planned_shard(
    item: tuple[int, Iterable[tuple[str, int]]],
    source: SourceReader,
    spec: FeatureSpec | None,
    config: GraphConfig,
) -> tuple[int, StatsState]:
    """(shard number, units) -> the shard file under DST plus its JSON sidecar; returns the shard's
    number and stats, for :class:`~shardfeed.pipelines.stats_combine.MergeShardStats`. ``spec``
    None: the features the graph decided."""
    guard_worker()
    spec = spec or load_spec(config.work)
    local, parts = item  # the shard's number in this plan; a split's shards number on
    plan = load_plan(config.work)
    large = plan.units[local] > LARGE_SHARD_UNITS
    with _LARGE_SHARD if large else contextlib.nullcontext():
        written = _write_shard(local, parts, plan, source, spec, config)
        if large:
            trim_c_heap()  # its bookkeeping's freed memory, in this thread's arena (heap_trim.py)
        return written


#: A shard writer's bookkeeping of its units (their table, sorted, and the inputs digest) peaks at
#: about 300 bytes per unit: 290 MB for a shard of 1M tiny records. One process (the default
#: runner's threads) writes at most one shard of more units than this at a time, so its memory stays
#: that of one such shard (bench_memory's 10M-record run) while shards of fewer units overlap.
LARGE_SHARD_UNITS = 1 << 18
_LARGE_SHARD = threading.Lock()


def _write_shard(
    local: int,
    parts: Iterable[tuple[str, int]],
    plan: Plan,
    source: SourceReader,
    spec: FeatureSpec,
    config: GraphConfig,
) -> tuple[int, StatsState]:
    """:func:`write_planned_shard` of shard ``local`` of ``plan``."""
    number = config.shard_offset + local
    row_start = config.row_offset + plan.row_start[local]
    unit_start = config.unit_offset + plan.unit_start[local]
    groups = [_unit_group(config, file, group) for file, group in parts]
    # shuffled: by stable key; source order: files() is sorted, so (file, position) is source order
    by = ["key", "file", "position"] if isinstance(plan, ShardPlan) else ["file", "position"]
    units = pa.concat_tables(groups)
    del groups  # the sorted copy below replaces them (a 1M-unit shard's table is about 150 MB)
    units = units.take(pc.sort_indices(units, [(name, "ascending") for name in by]))
    spooled = units.column("spooled").to_numpy(zero_copy_only=False)
    needs_refs = not spooled.all() or hasattr(source, "write_videos")
    refs = unit_refs(units) if needs_refs else []
    sidecar = config.sidecar(number)
    inputs = shard_inputs_digest(local, units, refs, source, spec, plan, config)
    reused = reusable_outcome(config.dst, config.sidecar(number, previous=True), inputs)
    if reused is not None:  # an interrupted run already wrote exactly this shard
        _write_sidecar(sidecar, inputs, reused)
        beam.metrics.Metrics.counter("shardfeed", "shards_reused").inc()
        return number, _stats_state(reused)
    table = read_units(units, spooled, refs, source, spec, config)
    unit_rows = units.column("rows").to_numpy()
    table = renumber(table, spec, unit_rows, row_start, unit_start)
    episodic = "episode_index" in spec
    # on an object store the shard is built in this worker's temporary directory and sent to its
    # final key, hashed while sending (formats/object_upload.py); locally it is written in place
    with config.dst.staged_root() as root:
        outcome = build_shard(
            root,
            number,
            table,
            spec,
            config.options,
            index_start=row_start,
            source_episode_ids=units.column("position").to_pylist() if episodic else None,
        )
        outcome = add_videos(outcome, root, source, refs)  # MP4s, if any
        config.dst.land(root, [(r.path, r.bytes, r.sha256) for r in _outcome_files(outcome)])
    _write_sidecar(sidecar, inputs, outcome)
    beam.metrics.Metrics.counter("shardfeed", "shards").inc()
    beam.metrics.Metrics.counter("shardfeed", "bytes").inc(outcome.record.bytes)
    # the allocator keeps freed pages of spool batches and shard columns for reuse; hand them back,
    # or a long-lived writer's resident memory creeps up with the number of shards it writes
    pa.default_memory_pool().release_unused()
    return number, _stats_state(outcome)


def _stats_state(outcome: ShardOutcome) -> StatsState:
    return {name: stats.to_state() for name, stats in outcome.stats.items()}


def _write_sidecar(path: StorePath, inputs: str, outcome: ShardOutcome) -> None:
    state = {"inputs": inputs, "outcome": outcome.to_state()}
    # atomic, not fsynced: the shard itself is durable before this is written, and a sidecar a
    # crash left torn or empty is not reused (``reusable_outcome`` re-checks every file it names)
    path.write_bytes(json.dumps(state, separators=(",", ":")).encode())


def _outcome_files(outcome: ShardOutcome) -> list[FileRecord]:
    """The files a shard writer wrote: the shard, and its videos if any."""
    return [outcome.record, *getattr(outcome, "files", ())]


def shard_inputs_digest(
    number: int,
    units: pa.Table,
    refs: Sequence[UnitRef],
    source: SourceReader,
    spec: FeatureSpec,
    plan: Plan,
    config: GraphConfig,
) -> str:
    """sha256 of everything a shard's bytes depend on: its units in order (``units``, a unit table,
    with their content hashes), the media files it cuts videos from (``refs``: the same units),
    where its rows and episodes start, the spec and the dataset options. ``number`` is the shard's
    number in ``plan`` (a split's offsets apply)."""
    h = hashlib.sha256()
    head = {
        "number": config.shard_offset + number,
        "row_start": config.row_offset + int(plan.row_start[number]),
        "unit_start": config.unit_offset + int(plan.unit_start[number]),
        "spec": spec.to_json(),
        "options": dataclasses.asdict(config.options),
        # a shard written by another shard writer (another layout or checks) is not reused
        "writer": SHARD_WRITER_VERSION,
        "units": units.num_rows,
    }
    h.update(canonical_json(head).encode())
    for name in ("position", "rows", "payload_bytes"):
        h.update(units.column(name).to_numpy().astype("<i8").tobytes())
    for name in ("file", "content_hash"):  # neither holds a newline
        for part in _joined_lines(units.column(name)):
            h.update(part)
        h.update(b"\0")
    if isinstance(source, StampedInputs):
        for line in source.input_stamps(refs):
            h.update(f"\n{line}".encode("utf-8", "surrogateescape"))
    return h.hexdigest()


def _joined_lines(column: pa.ChunkedArray) -> Iterator[pa.Buffer | bytes]:
    """A string column's values joined by newlines, as UTF-8 bytes in parts (one per chunk): an
    Arrow call per chunk, not a Python string per unit (a 1M-row shard's two columns made 2M of
    them, about 200 MB at once)."""
    for k, chunk in enumerate(c for c in column.chunks if len(c)):
        if k:
            yield b"\n"
        large = pa.types.is_large_string(chunk.type)
        whole = (pa.LargeListArray if large else pa.ListArray).from_arrays(
            pa.array([0, len(chunk)], pa.int64() if large else pa.int32()), chunk
        )
        newline = pa.scalar("\n", chunk.type)
        yield pc.binary_join(whole, newline)[0].as_buffer()


def reusable_outcome(dst: StorePath, sidecar: StorePath, inputs: str) -> ShardOutcome | None:
    """The outcome an earlier, interrupted run recorded for the same shard inputs, if every file it
    names is still whole (size and sha256 re-checked); else None and the shard is written anew.

    A sidecar from an older shardfeed, without the shard's row sizes or costs, is never reused."""
    try:
        state = json.loads(sidecar.read_bytes())
        if (
            state.get("inputs") != inputs
            or not {"row_bytes", "row_cost"} <= state["outcome"].keys()
        ):
            return None
        outcome = ShardOutcome.from_state(state["outcome"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError, ShardfeedError):
        return None
    if not all(_file_matches(dst / r.path, r.bytes, r.sha256) for r in _outcome_files(outcome)):
        return None
    return outcome


def _file_matches(path: StorePath, size: int, sha256: str) -> bool:
    try:
        with path.open_input() as handle:
            if handle.size() != size:
                return False
            digest = hashlib.sha256()
            while chunk := handle.read(8 << 20):
                digest.update(chunk)
            return digest.hexdigest() == sha256
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
            files | "Spread" >> Spread() | "Infer" >> beam.Map(infer_file, self.source, self.config)
        )


class ScanFiles(beam.PTransform):
    """file paths -> the same paths, once each file's units, totals and rejects are written."""

    def __init__(self, source: SourceReader, spec: FeatureSpec | None, config: GraphConfig) -> None:
        super().__init__()
        self.source, self.spec, self.config = source, spec, config

    def expand(self, files: beam.PCollection) -> beam.PCollection:
        return (
            files
            | "Spread" >> Spread()
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

    def __init__(self, source: SourceReader, spec: FeatureSpec | None, config: GraphConfig) -> None:
        super().__init__()
        self.source, self.spec, self.config = source, spec, config

    def expand(self, files: beam.PCollection) -> beam.PCollection:
        return (
            files
            | "Spread" >> Spread()
            # (shard, (file, group)) per source file and shard: the units stay on disk
            | "KeyByShard" >> beam.FlatMap(keyed_by_shard, self.config)
            | "GroupByShard" >> beam.GroupByKey()
            # (shard, [(file, group), ...]) -> rows written
            | "WriteShard" >> beam.Map(write_planned_shard, self.source, self.spec, self.config)
        )


class DecideSpec(beam.PTransform):
    """file paths (or pieces) -> the same paths (or the pieces with their first positions), once
    every inference part is merged into the features (``spec_stage``); none when the source
    refuses the schema."""

    def __init__(self, source: SourceReader, config: GraphConfig) -> None:
        super().__init__()
        self.source, self.config = source, config

    def expand(self, files: beam.PCollection) -> beam.PCollection:
        cost = self.config.options.cost
        return (
            files
            | "Infer" >> InferSchema(self.source, self.config)
            | "OneKey" >> beam.Map(_under_one_key)
            | "AllInferred" >> beam.GroupByKey()  # (0, [every file]): waits for every part
            | "Decide" >> beam.FlatMap(decide_spec, self.source, self.config.work, cost)
        )


class ScanPieces(beam.PTransform):
    """numbered pieces -> their files, once every piece is scanned and each file's pieces are
    joined into the file's unit table, totals and rejects."""

    def __init__(self, source: SourceReader, spec: FeatureSpec | None, config: GraphConfig) -> None:
        super().__init__()
        self.source, self.spec, self.config = source, spec, config

    def expand(self, pieces: beam.PCollection) -> beam.PCollection:
        return (
            pieces
            | "Spread" >> Spread()
            | "Scan" >> beam.Map(scan_piece, self.source, self.spec, self.config)
            | "ByFile" >> beam.GroupByKey()  # (file, [piece index, ...])
            | "Join" >> beam.Map(merge_pieces, self.config)
        )


class GuessSpec(beam.PTransform):
    """pieces -> the pieces with their first positions, once the features their samples give
    are saved as the guess (``spec_stage.decide_guess``)."""

    def __init__(self, source: InferringSource, config: GraphConfig) -> None:
        super().__init__()
        self.source, self.config = source, config

    def expand(self, pieces: beam.PCollection) -> beam.PCollection:
        cost = self.config.options.cost
        return (
            pieces
            | "Spread" >> Spread()
            | "Sample" >> beam.Map(sample_piece, self.source, self.config)
            | "OneKey" >> beam.Map(_under_one_key)
            | "AllSampled" >> beam.GroupByKey()
            | "Guess" >> beam.FlatMap(decide_guess, self.source, self.config.work, cost)
        )


class ScanInferring(beam.PTransform):
    """numbered pieces -> their files, scanned and inferred in one pass: each piece is typed to
    the guess while its kinds are counted; once all are, the full counts decide the features
    (``spec_stage.confirm_spec``), every piece is scanned again only if they are not the guess,
    and each file's pieces are joined."""

    def __init__(self, source: InferringSource, config: GraphConfig) -> None:
        super().__init__()
        self.source, self.config = source, config

    def expand(self, pieces: beam.PCollection) -> beam.PCollection:
        source, config = self.source, self.config
        return (
            pieces
            | "Spread" >> Spread()
            | "Scan" >> beam.Map(scan_guessing, source, config)
            | "OneKey" >> beam.Map(_under_one_key)
            | "AllScanned" >> beam.GroupByKey()  # (0, [every piece]): waits for the whole scan
            | "Confirm" >> beam.FlatMap(confirm_spec, source, config.work, config.options.cost)
            | "SpreadAgain" >> Spread()
            | "Rescan" >> beam.Map(rescan_if_guessed_wrong, source, config)
            | "ByFile" >> beam.GroupByKey()  # (file, [piece index, ...])
            | "Join" >> beam.Map(merge_pieces, config)
        )


class ConvertFiles(beam.PTransform):
    """source file paths -> the merged stats, saved: scan, plan, write and summarise, one pipeline.

    ``spec`` None: a data-typed source's features are inferred first, in the same pipeline
    (``DecideSpec``), and loaded from the work dir by the steps that need them; a splittable
    source's large files are then scanned in pieces of ``config.piece_bytes``."""

    def __init__(
        self,
        source: SourceReader,
        spec: FeatureSpec | None,
        config: GraphConfig,
        settings: PlanSettings,
    ) -> None:
        super().__init__()
        self.source, self.spec, self.config, self.settings = source, spec, config, settings

    def expand(self, files: beam.PCollection) -> beam.PCollection:
        source, config = self.source, self.config
        if self.spec is None and isinstance(source, InferringSource):
            # schema inference rides on the scan: a guess from each piece's head, checked
            # against the full counts the scan takes (scanning again only if they differ)
            scanned = (
                files
                | "Pieces" >> beam.FlatMap(pieces_of, source, config.piece_bytes)
                | "GuessSpec" >> GuessSpec(source, config)
                | "ScanInferring" >> ScanInferring(source, config)
            )
        elif self.spec is None and isinstance(source, SplittableSource):
            # a large file is several tasks; the pieces learn their first positions from the
            # schema step, which counts them while inferring
            scanned = (
                files
                | "Pieces" >> beam.FlatMap(pieces_of, source, config.piece_bytes)
                | "DecideSpec" >> DecideSpec(source, config)
                | "ScanPieces" >> ScanPieces(source, None, config)
            )
        else:
            if self.spec is None:
                files = files | "DecideSpec" >> DecideSpec(source, config)
            scanned = files | "ScanFiles" >> ScanFiles(source, self.spec, config)
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


def _under_one_key(item: Any) -> tuple[int, Any]:
    """Any element (a file, a piece) under key 0, so one GroupByKey gathers them all."""
    return 0, item


def _position_key(position: str) -> tuple[str, int, str]:
    kind, _, rest = position.partition(":")
    return (kind, int(rest), "") if rest.isdigit() else (kind, -1, rest)
