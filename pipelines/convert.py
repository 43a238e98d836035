"""The conversion graph: scan files into unit references, plan shards over stable-hash buckets,
and let each shard writer read its own units. Payload bytes never cross a Beam shuffle.

Element shapes between stages are noted in comments. The driver publishes afterwards: it reads the
per-shard sidecars in shard order, so stats, episodes and the manifest are byte-identical on any
runner and worker count.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import apache_beam as beam
import numpy as np
import pyarrow as pa
from apache_beam.pvalue import AsSingleton

from shardfeed.formats.atomic import atomic_write_bytes
from shardfeed.formats.publish import DatasetOptions, build_shard
from shardfeed.formats.sources.base import SourceReader, UnitRef
from shardfeed.planning.shard_plan import (
    BucketTotal,
    ShardPlan,
    bucket_of,
    num_buckets,
    plan_shards,
)
from shardfeed.schemas.features import FeatureSpec
from shardfeed.schemas.rejects import RejectRecord
from shardfeed.transforms.hashing import shuffle_key

WORK_DIR = ".shardfeed-work"  # under DST while a run is in flight; removed after publishing
REJECTS = "rejects"


@dataclass(frozen=True)
class PlannedUnit:
    """A unit reference with its stable shuffle key (the sort key inside a shard)."""

    key: int
    ref: UnitRef

    def sort_key(self) -> tuple[int, str, int]:
        return (self.key, self.ref.file, self.ref.position)


@dataclass(frozen=True)
class GraphConfig:
    dst: str
    seed: int
    options: DatasetOptions
    work: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "work", os.path.join(self.dst, WORK_DIR))


class ScanFile(beam.DoFn):
    """file path -> PlannedUnit..., and RejectRecord on the ``rejects`` output."""

    def __init__(self, source: SourceReader, seed: int) -> None:
        self.source = source
        self.seed = seed

    def process(self, file: str, spec: FeatureSpec) -> Iterable[Any]:
        result = self.source.scan(file, spec)
        beam.metrics.Metrics.counter("shardfeed", "files").inc()
        beam.metrics.Metrics.counter("shardfeed", "units").inc(len(result.units))
        for ref in result.units:
            yield PlannedUnit(
                shuffle_key(self.seed, ref.content_hash, f"{ref.file}:{ref.position}"), ref
            )
        for reject in result.rejects:
            yield beam.pvalue.TaggedOutput(REJECTS, reject)


def write_rejects(item: tuple[str, Iterable[RejectRecord]], work: str) -> str:
    """(source file, rejects) -> a sorted JSONL part under the work dir; returns its name."""
    source, rejects = item
    ordered = sorted(rejects, key=lambda r: (_position_key(r.position), r.reason, r.message))
    name = f"{_stable_name(source)}.jsonl"
    atomic_write_bytes(
        os.path.join(work, "rejects", name), "".join(r.dumps() + "\n" for r in ordered).encode()
    )
    return name


def write_planned_shard(
    item: tuple[int, Iterable[PlannedUnit]],
    source: SourceReader,
    spec: FeatureSpec,
    plan: ShardPlan,
    config: GraphConfig,
) -> int:
    """(shard number, units) -> the shard file under DST plus its JSON sidecar; returns rows."""
    number, units = item
    ordered = sorted(units, key=PlannedUnit.sort_key)
    table = source.read([u.ref for u in ordered], spec)
    table = renumber(
        table, spec, [u.ref.rows for u in ordered], plan.row_start[number], plan.unit_start[number]
    )
    episodic = "episode_index" in spec
    outcome = build_shard(
        config.dst,
        number,
        table,
        spec,
        config.options,
        index_start=plan.row_start[number],
        source_episode_ids=[u.ref.position for u in ordered] if episodic else None,
    )
    sidecar = os.path.join(config.work, "shards", f"{number:06d}.json")
    atomic_write_bytes(sidecar, json.dumps(outcome.to_state(), separators=(",", ":")).encode())
    beam.metrics.Metrics.counter("shardfeed", "shards").inc()
    beam.metrics.Metrics.counter("shardfeed", "bytes").inc(outcome.record.bytes)
    return table.num_rows


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
        table = table.set_column(
            position, table.schema.field(position), array.cast(table.schema.field(position).type)
        )
    return table


class ConvertGraph(beam.PTransform):
    """files -> written shards: scan, plan over buckets, write each shard from its own references."""

    def __init__(self, source: SourceReader, spec: FeatureSpec, config: GraphConfig) -> None:
        super().__init__()
        self.source = source
        self.spec = spec
        self.config = config

    def expand(self, files: beam.PCollection) -> beam.PCollection:
        cfg, source = self.config, self.source
        spec = files.pipeline | "Spec" >> beam.Create([self.spec])
        scanned = files | "ScanFiles" >> beam.ParDo(
            ScanFile(source, cfg.seed), AsSingleton(spec)
        ).with_outputs(REJECTS, main="units")
        # rejects: RejectRecord -> (file, [RejectRecord]) -> counts by reason, one JSONL part per file
        _ = (
            scanned[REJECTS]
            | "KeyRejectsByFile" >> beam.Map(lambda r: (r.source, r))
            | "GroupRejects" >> beam.GroupByKey()
            | "WriteRejects" >> beam.Map(write_rejects, cfg.work)
        )
        units = scanned["units"]  # PlannedUnit
        total = (
            units
            | "UnitBytes" >> beam.Map(lambda u: u.ref.payload_bytes)
            | "TotalBytes" >> beam.CombineGlobally(sum)
        )
        # (bucket, PlannedUnit): a unit's bucket depends only on its key, its size and the total
        keyed = units | "AssignBucket" >> beam.Map(
            _bucketed, cfg.options.target_shard_bytes, AsSingleton(total)
        )
        plan = (
            keyed
            | "BucketTotals"
            >> beam.Map(
                lambda kv: (kv[0], BucketTotal(kv[0], 1, kv[1].ref.rows, kv[1].ref.payload_bytes))
            )
            | "SumBuckets" >> beam.CombinePerKey(_sum_totals)
            | "DropKeys" >> beam.Values()
            | "CollectBuckets" >> beam.combiners.ToList()
            | "PlanShards" >> beam.Map(plan_shards, cfg.options.target_shard_bytes)
        )
        # (shard, [PlannedUnit]) -> rows written
        return (
            keyed
            | "KeyByShard" >> beam.Map(lambda kv, p: (p.shard_of[kv[0]], kv[1]), AsSingleton(plan))
            | "GroupByShard" >> beam.GroupByKey()
            | "WriteShards"
            >> beam.Map(write_planned_shard, source, AsSingleton(spec), AsSingleton(plan), cfg)
        )


def _bucketed(unit: PlannedUnit, target: int, total: int) -> tuple[int, PlannedUnit]:
    return bucket_of(unit.key, unit.ref.payload_bytes, target, num_buckets(total, target)), unit


def _sum_totals(totals: Iterable[BucketTotal]) -> BucketTotal:
    out = None
    for t in totals:
        out = t if out is None else out + t
    return out


def _stable_name(text: str) -> str:
    return hashlib.blake2b(text.encode(), digest_size=12).hexdigest()


def _position_key(position: str) -> tuple[str, int, str]:
    kind, _, rest = position.partition(":")
    return (kind, int(rest), "") if rest.isdigit() else (kind, -1, rest)
