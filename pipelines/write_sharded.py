"""``WriteShardedDataset``: shardfeed's writer as a Beam PTransform over a user's own samples.

Apply it to a bounded ``PCollection`` of samples (dicts: feature name -> value) inside any Beam
pipeline; it writes a complete, published shardfeed dataset (LeRobot v3.0 layout, size-balanced
Parquet shards, ``meta/shardfeed/manifest.json`` last) and outputs the manifest.

It runs the CLI's code path from planning on: ``bucket_of`` and ``plan_shards`` plan the shards,
``build_shard`` writes each one and ``publish`` writes the metadata and manifest. What differs is
forced by the input: the elements are the samples themselves, so their payload crosses the
shuffle (the CLI shuffles only references into files it can re-read), and a sample has no
position, so its order comes from its content alone:

    content_hash(row)            row = the sample as a one-row Arrow IPC record batch in the
                                 spec's schema (canonical whatever Python types the values had)
    shuffle_key(seed, hash, hash)
    order in a shard             (shuffle key, content hash, row bytes): exact duplicates tie,
                                 and tie only with themselves, so any order of them is the same

Planning sees only per-bucket totals, and every step breaks ties on stable keys, so the same
multiset of samples gives byte-identical output on any runner, in any input order.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import apache_beam as beam
import pyarrow as pa
from apache_beam.transforms.window import GlobalWindows

from shardfeed.formats.atomic import atomic_write_bytes
from shardfeed.formats.columns import to_table
from shardfeed.formats.layout import is_lease_file
from shardfeed.formats.payload import table_row_bytes
from shardfeed.formats.publish import (
    DatasetExistsError,
    DatasetOptions,
    ShardOutcome,
    build_shard,
    prepare_root,
    publish,
)
from shardfeed.pipelines.convert import renumber
from shardfeed.pipelines.graph_config import WORK_DIR
from shardfeed.planning.shard_plan import BucketTotal, ShardPlan, bucket_of, plan_shards
from shardfeed.schemas.errors import ShardfeedError
from shardfeed.schemas.features import Feature, FeatureSpec
from shardfeed.schemas.manifest import MANIFEST_PATH, Manifest
from shardfeed.schemas.units import parse_size
from shardfeed.transforms.hashing import content_hash, shuffle_key

__all__ = ["WriteShardedDataset"]

#: One sample on its way to its shard: ``(order, payload_bytes, row)``.
#: ``order`` is the shuffle key (8 bytes big-endian) then the content hash (16 bytes), so sorting
#: the bytes sorts by (key, hash). ``row`` is the one-row IPC record batch the hash covers.
#: (The 64-bit key travels as bytes: Beam's int coder is signed 64-bit.)
Sample = tuple[bytes, int, bytes]
#: Per-bucket running totals: ``(units, rows, payload bytes)``.
Totals = tuple[int, int, int]


class WriteShardedDataset(beam.PTransform):
    """Write a bounded ``PCollection`` of samples as a published shardfeed dataset at ``dst``.

    Input elements are dicts mapping feature names to values, as ``write_dataset`` accepts them
    in a list of row dicts (numbers or numpy scalars, lists or numpy arrays for tensors, ``str``
    for strings, encoded ``bytes`` or ``{"bytes", "path"}`` for images; a missing key is null;
    keys that are not features are ignored). The output is a one-element ``PCollection`` holding
    the published :class:`~shardfeed.schemas.manifest.Manifest`.

    - ``features``: a ``FeatureSpec``, a LeRobot ``features`` dict or a list of ``Feature``.
    - ``target_shard_size`` and ``row_group_size`` are payload bytes (ints or strings such as
      ``"100MB"``, ``"4MiB"``); ``shuffle_seed`` picks the (content-keyed) order.
    - ``tasks``, ``fps`` and ``robot_type`` go to ``meta/info.json`` (and ``meta/tasks.parquet``);
      ``source`` is recorded as ``provenance.source`` in the manifest.
    - ``cost``: what ``samples.parquet``'s per-sample cost counts (``auto``, ``tokens``,
      ``pixels``, ``frames`` or ``bytes``; ``formats/cost.py``).
    - ``overwrite``: replace a dataset already at ``dst``. Without it a non-empty ``dst`` is
      refused when the transform is applied (a ``dst`` holding only an interrupted run's work
      directory is taken over). With it, the old dataset is removed only once every input sample
      has been encoded and the shards are planned.

    An ``index`` feature is rewritten to each row's global position (0..N-1), as the CLI does.
    **Episodic data is not supported**: features containing ``episode_index`` are refused
    (an episode would have to be gathered from its frames first); convert such data from files
    with ``shardfeed convert``. The input is re-windowed into the global window, so it must be
    bounded. ``dst`` must be a local path that every worker sees at the same place.
    """

    def __init__(
        self,
        dst: str | os.PathLike[str],
        features: FeatureSpec | Mapping[str, Any] | Sequence[Feature],
        *,
        target_shard_size: int | str = "100MB",
        row_group_size: int | str = "4MiB",
        shuffle_seed: int = 0,
        tasks: Sequence[str] = (),
        fps: int | float = 0,
        robot_type: str | None = None,
        overwrite: bool = False,
        source: str = "beam",
        cost: str = "auto",
    ) -> None:
        super().__init__()
        spec = features if isinstance(features, FeatureSpec) else FeatureSpec.of(features)
        if "episode_index" in spec:
            raise ShardfeedError(
                "WriteShardedDataset does not write episodic data (the features contain "
                "'episode_index'); convert it from files with `shardfeed convert` instead"
            )
        target, row_group = parse_size(target_shard_size), parse_size(row_group_size)
        if target < 1 or row_group < 1:
            raise ValueError("target_shard_size and row_group_size must be at least 1 byte")
        options = DatasetOptions(
            tasks=tuple(tasks),
            fps=fps,
            robot_type=robot_type,
            target_shard_bytes=target,
            row_group_bytes=row_group,
            source=source,
            cost=cost,
            content_options={
                "from": "beam",
                "target_shard_size": target,
                "row_group_size": row_group,
                "shuffle_seed": int(shuffle_seed),
            },
        )
        self._config = _Config(
            os.path.abspath(os.fspath(dst)), spec, options, int(shuffle_seed), overwrite
        )

    def expand(self, samples: beam.PCollection[dict[str, Any]]) -> beam.PCollection[Manifest]:
        config = self._config
        _check_runner(samples.pipeline.runner)
        _check_destination(config)
        # samples: dict[str, Any] -> (bucket, Sample)
        keyed = samples | "Encode" >> _EncodeSamples(config)
        # -> one ShardPlan, emitted once DST is prepared (side input: orders the writes after it)
        plan = keyed | "Plan" >> _PlanShards(config)
        # -> shard number, once the shard and its sidecar are written
        written = keyed | "Write" >> _WriteShards(config, plan)
        # -> the Manifest, after every shard
        return written | "Publish" >> _Publish(config, plan)


@dataclass(frozen=True)
class _Config:
    """Everything the stages need; small and picklable."""

    dst: str
    spec: FeatureSpec
    options: DatasetOptions
    seed: int
    overwrite: bool

    @property
    def work(self) -> str:
        return os.path.join(self.dst, WORK_DIR)

    def sidecar(self, number: int) -> str:
        return os.path.join(self.work, "shards", f"{number:06d}.json")


# ---------------------------------------------------------------------------------------------
# Encode: sample dict -> (bucket, Sample)


class _EncodeSamples(beam.PTransform):
    """dict[str, Any] -> (bucket, Sample), in the global window."""

    def __init__(self, config: _Config) -> None:
        super().__init__()
        self._config = config

    def expand(self, samples: beam.PCollection) -> beam.PCollection:
        return (
            samples
            | "GlobalWindow" >> beam.WindowInto(GlobalWindows())
            | "Encode" >> beam.ParDo(_EncodeSample(self._config))
        )


class _EncodeSample(beam.DoFn):
    """Conform one sample to the spec, hash it and give it its shuffle key and bucket."""

    def __init__(self, config: _Config) -> None:
        self._config = config
        self._samples = beam.metrics.Metrics.counter("shardfeed", "samples")

    def process(self, sample: dict[str, Any]) -> Iterator[tuple[int, Sample]]:
        if not isinstance(sample, Mapping):
            raise TypeError(
                f"WriteShardedDataset takes dicts (feature name -> value), got {type(sample).__name__}"
            )
        config = self._config
        table = to_table([sample], config.spec)
        row = table.to_batches()[0].serialize().to_pybytes()
        digest = content_hash(row)
        key = shuffle_key(config.seed, digest, digest)
        payload = int(table_row_bytes(table)[0])
        bucket = bucket_of(key, payload, config.options.target_shard_bytes)
        self._samples.inc()
        yield bucket, (key.to_bytes(8, "big") + bytes.fromhex(digest), payload, row)


# ---------------------------------------------------------------------------------------------
# Plan: (bucket, Sample) -> ShardPlan


class _PlanShards(beam.PTransform):
    """(bucket, Sample) -> one ShardPlan, emitted after DST is prepared for writing."""

    def __init__(self, config: _Config) -> None:
        super().__init__()
        self._config = config

    def expand(self, keyed: beam.PCollection) -> beam.PCollection:
        return (
            keyed
            # (bucket, (1, 1, payload))
            | "Count" >> beam.MapTuple(lambda bucket, sample: (bucket, (1, 1, sample[1])))
            # (bucket, (units, rows, bytes)): integer sums, so any combining order agrees
            | "SumBuckets" >> beam.CombinePerKey(beam.combiners.TupleCombineFn(sum, sum, sum))
            # BucketTotal
            | "ToTotals" >> beam.MapTuple(_bucket_total)
            # ShardPlan (memory bounded by the bucket count, not the sample count)
            | "PlanShards" >> beam.CombineGlobally(_PlanFn(self._config.options.target_shard_bytes))
            # ShardPlan, unchanged, once DST is ready
            | "PrepareDestination" >> beam.Map(_prepare_destination, self._config)
        )


def _bucket_total(bucket: int, totals: Totals) -> BucketTotal:
    return BucketTotal(bucket, *totals)


class _PlanFn(beam.CombineFn):
    """BucketTotal... -> ShardPlan via ``plan_shards`` (which also sums partial totals)."""

    def __init__(self, target_bytes: int) -> None:
        self._target = target_bytes

    def create_accumulator(self) -> list[BucketTotal]:
        return []

    def add_input(self, totals: list[BucketTotal], total: BucketTotal) -> list[BucketTotal]:
        totals.append(total)
        return totals

    def merge_accumulators(self, accumulators: Iterable[list[BucketTotal]]) -> list[BucketTotal]:
        return [total for totals in accumulators for total in totals]

    def extract_output(self, totals: list[BucketTotal]) -> ShardPlan:
        return plan_shards(totals, self._target)


def _prepare_destination(plan: ShardPlan, config: _Config) -> ShardPlan:
    """Make DST ready (old dataset removed when allowed, empty work dir); pass the plan on."""
    prepare_root(config.dst, config.overwrite or _only_leftovers(config.dst))
    shutil.rmtree(config.work, ignore_errors=True)
    os.makedirs(os.path.join(config.work, "shards"))
    return plan


# ---------------------------------------------------------------------------------------------
# Write: (bucket, Sample) -> shard number


class _WriteShards(beam.PTransform):
    """(bucket, Sample) -> shard number, once that shard and its JSON sidecar are written."""

    def __init__(self, config: _Config, plan: beam.PCollection) -> None:
        super().__init__()
        self._config, self._plan = config, plan

    def expand(self, keyed: beam.PCollection) -> beam.PCollection:
        plan = beam.pvalue.AsSingleton(self._plan)
        return (
            keyed
            # (shard, Sample)
            | "KeyByShard" >> beam.Map(_shard_of, plan=plan)
            # (shard, [Sample]): payloads cross this shuffle (the elements are the samples)
            | "GroupByShard" >> beam.GroupByKey()
            # shard number
            | "WriteShard" >> beam.Map(_write_shard, self._config, plan=plan)
        )


def _shard_of(item: tuple[int, Sample], plan: ShardPlan) -> tuple[int, Sample]:
    bucket, sample = item
    return plan.shard_of[bucket], sample


def _write_shard(item: tuple[int, Iterable[Sample]], config: _Config, plan: ShardPlan) -> int:
    """(shard, samples) -> the shard under DST and its outcome sidecar; returns the number."""
    number, samples = item
    ordered = sorted(samples, key=lambda s: (s[0], s[2]))  # (key, hash), then the row bytes
    rows, payload = len(ordered), sum(s[1] for s in ordered)
    if (rows, payload) != (plan.rows[number], plan.bytes[number]):
        raise ShardfeedError(
            f"shard {number}: the runner delivered {rows} samples ({payload} payload bytes), "
            f"the plan counted {plan.rows[number]} ({plan.bytes[number]} bytes)"
        )
    table = _decode_rows([s[2] for s in ordered], config.spec)
    start = plan.row_start[number]
    table = renumber(table, config.spec, [1] * rows, start, plan.unit_start[number])
    outcome = build_shard(config.dst, number, table, config.spec, config.options, index_start=start)
    state = json.dumps(outcome.to_state(), separators=(",", ":")).encode()
    atomic_write_bytes(config.sidecar(number), state)
    beam.metrics.Metrics.counter("shardfeed", "shards").inc()
    beam.metrics.Metrics.counter("shardfeed", "bytes").inc(outcome.record.bytes)
    return number


def _decode_rows(rows: Sequence[bytes], spec: FeatureSpec) -> pa.Table:
    """One-row IPC record batches -> one table in the spec's schema, in the given order."""
    schema = spec.arrow_schema()
    batches = [pa.ipc.read_record_batch(pa.py_buffer(row), schema) for row in rows]
    return pa.Table.from_batches(batches, schema=schema).combine_chunks()


# ---------------------------------------------------------------------------------------------
# Publish: shard numbers -> Manifest


class _Publish(beam.PTransform):
    """shard number... -> the published Manifest (one element, after every shard is written)."""

    def __init__(self, config: _Config, plan: beam.PCollection) -> None:
        super().__init__()
        self._config, self._plan = config, plan

    def expand(self, written: beam.PCollection) -> beam.PCollection:
        return (
            written
            # [shard number]: a single list, once every writer is done ([] for no input)
            | "CollectShards" >> beam.combiners.ToList()
            # Manifest
            | "PublishDataset"
            >> beam.Map(_publish, self._config, plan=beam.pvalue.AsSingleton(self._plan))
        )


def _publish(numbers: list[int], config: _Config, plan: ShardPlan) -> Manifest:
    """Read the sidecars in shard order, publish (manifest last), remove the work dir."""
    if sorted(numbers) != list(range(plan.num_shards)):
        raise ShardfeedError(
            f"the runner reported shards {sorted(numbers)[:10]}... for {plan.num_shards} planned "
            "shards; nothing was published"
        )
    outcomes = []
    for number in range(plan.num_shards):
        with open(config.sidecar(number), encoding="utf-8") as handle:
            outcomes.append(ShardOutcome.from_state(json.load(handle)))
    manifest = publish(config.dst, config.spec, outcomes, config.options)
    shutil.rmtree(config.work, ignore_errors=True)
    return manifest


# ---------------------------------------------------------------------------------------------
# Checks made when the transform is applied

#: Runners known to recompute a side input for every consumer, so PrepareDestination (which
#: empties the work dir) would run again while shards are being written.
_UNSAFE_RUNNERS = frozenset({"DaskRunner"})


def _check_runner(runner: object) -> None:
    name = type(runner).__name__
    if name in _UNSAFE_RUNNERS:
        raise ShardfeedError(
            f"WriteShardedDataset cannot run on {name}: Beam 2.77's DaskRunner re-evaluates "
            "side inputs for each consumer, so the destination would be prepared again while "
            "shards are being written. Use the in-process runner, or `shardfeed convert "
            "--runner=dask` for file sources"
        )


def _check_destination(config: _Config) -> None:
    """Refuse a non-empty DST early, when the transform is applied (nothing is changed here)."""
    dst = config.dst
    if config.overwrite or not os.path.isdir(dst):
        return
    if all(is_lease_file(name) for name in os.listdir(dst)):
        return
    if not _only_leftovers(dst):
        what = "a dataset" if os.path.exists(os.path.join(dst, MANIFEST_PATH)) else "files"
        raise DatasetExistsError(
            f"{dst} already holds {what}; pass overwrite=True to WriteShardedDataset to replace it"
        )


def _only_leftovers(dst: str) -> bool:
    """A DST holding an interrupted run's work dir and no manifest may be taken over."""
    return os.path.isdir(os.path.join(dst, WORK_DIR)) and not os.path.exists(
        os.path.join(dst, MANIFEST_PATH)
    )
