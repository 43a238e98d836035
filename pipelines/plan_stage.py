"""The planning step inside the conversion graph, between the scan and the shard writers.

Scan, plan and write run as **one** Beam pipeline: a runner that starts worker processes
(``--direct_running_mode=multi_processing``, Dask) then starts them once, not once per stage
(about 4 s per pipeline with two local workers). The plan still needs every file's scan, so the
scanned file names meet in one ``GroupByKey`` and a single ``plan_files`` call plans from the small
per-file totals under the work dir, exactly as a driver would. Its outputs are work files too:

- ``plan.json``: the plan's kind, shard count, reject counts and timings, read by the driver and
  the progress line;
- ``plan.npz`` (shuffled: bucket -> shard arrays) or ``plan-contiguous.json`` (``--no-shuffle``),
  loaded (once per process) by the shard writers; no pickles.

Above ``max_reject_fraction`` nothing is planned: ``plan.json`` says so, no file reaches the writers,
and the driver raises. Pure planning stays in :mod:`shardfeed.planning.shard_plan`.
"""

from __future__ import annotations

import dataclasses
import functools
import io
import json
import os
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow.compute as pc

from shardfeed.formats.sources.base import unit_key
from shardfeed.formats.store_path import StorePath, local_scratch
from shardfeed.formats.unit_table import (
    UNIT_SUFFIX,
    KeyedUnit,
    read_totals,
    read_unit_sizes,
    read_unit_tuples,
    work_part,
)
from shardfeed.formats.weights_file import read_pairs
from shardfeed.pipelines.worker_guard import guard_worker
from shardfeed.planning.hot import fill, heat_order
from shardfeed.planning.shard_plan import (
    FINE_BUCKETS,
    BucketTotal,
    ContiguousPlan,
    ShardPlan,
    hot_bucket,
    plan_bucket_arrays,
    plan_classes,
    plan_contiguous,
    totals_from_arrays,
)
from shardfeed.schemas.errors import ShardfeedError
from shardfeed.schemas.rejects import RejectRecord
from shardfeed.schemas.units import parse_size_or_share

Plan = ShardPlan | ContiguousPlan
PLAN_INFO = "plan.json"
_SHUFFLED = "plan.npz"
_CONTIGUOUS = "plan-contiguous.json"


@dataclass(frozen=True)
class HotSettings:
    """``convert --hot-weights FILE --hot-budget B``: units with the highest weights, up to
    ``budget`` payload bytes (a size, or a share like ``10%``), go to dedicated leading shards."""

    weights: str  # a file of ``key,weight``; keys as ``shardfeed.formats.sources.base.unit_key``
    budget: str
    #: the driver's copy of ``weights`` in the work directory, which the planning worker reads
    #: (it may share no path with the driver)
    copy: StorePath | None = None

    def copied_to(self, work: StorePath) -> HotSettings:
        """These settings with the weights file copied under ``work``."""
        copy = work / HOT_WEIGHTS_DIR / os.path.basename(self.weights)
        with open(self.weights, "rb") as handle:
            copy.write_bytes(handle.read())
        return dataclasses.replace(self, copy=copy)

    def load(self) -> dict[str, float]:
        """``key -> weight``, from the copy when there is one."""
        if self.copy is None:
            return load_hot_weights(self.weights)
        with local_scratch() as scratch:
            path = os.path.join(scratch, self.copy.name)  # the name keeps its format's suffix
            with open(path, "wb") as handle:
                handle.write(self.copy.read_bytes())
            return load_hot_weights(path)


HOT_WEIGHTS_DIR = "hot-weights"  # under the work directory


@dataclass(frozen=True)
class PlanSettings:
    target_shard_bytes: int
    shuffled: bool
    max_reject_fraction: float
    hot: HotSettings | None = None
    dedup: bool = False  # drop later exact copies before planning (pipelines/dedup.py)


@dataclass(frozen=True)
class PlanInfo:
    """What ``plan.json`` says: enough for the driver to publish or to refuse."""

    num_shards: int
    planned_units: int
    reject_counts: dict[str, int]
    reject_files: list[str]
    too_many_rejects: bool
    started: float  # wall clock (time.time) when planning began, i.e. the scan had ended
    finished: float
    hot_shards: int = 0  # leading shards that hold the hot set
    hot_units: int = 0
    hot_keys_unmatched: int = 0  # keys of the weights file that named no unit

    @property
    def rejected_units(self) -> int:
        return sum(self.reject_counts.values())


def plan_files(
    item: tuple[Any, Iterable[str]], work: StorePath, settings: PlanSettings, source: object = None
) -> Iterable[str]:
    """(key, every scanned file) -> the files to write, once the plan is saved under ``work``.

    ``source`` names units for hot weights (``settings.hot``)."""
    guard_worker()
    started = time.time()
    files = sorted(item[1])  # the same order as the driver's source.files()
    reject_files, reject_counts = collect_rejects(work)
    hot = HotChoice()
    if settings.hot is not None:
        if not settings.shuffled:
            raise ShardfeedError("--hot-weights needs the shuffled plan; drop --no-shuffle")
        totals = read_bucket_totals(work, files)
        hot = choose_hot(work, files, source, settings.hot, sum(t.bytes for t in totals))
        plan: Plan
        plan, hot.shards = plan_classes(*hot.split(totals), settings.target_shard_bytes)
        save_hot_positions(work, hot.positions)
    elif settings.shuffled:
        plan = plan_bucket_arrays(*read_bucket_arrays(work, files), settings.target_shard_bytes)
    else:
        plan = plan_contiguous(
            [(f, _file_bytes(work, f)) for f in files],
            lambda f: read_unit_sizes(_part(work, "units", f)),
            settings.target_shard_bytes,
        )
    rejected = sum(reject_counts.values())
    total = sum(plan.units) + rejected
    too_many = bool(total) and rejected / total > settings.max_reject_fraction
    if not too_many:
        _save_plan(work, plan)
    info = PlanInfo(
        num_shards=plan.num_shards,
        planned_units=sum(plan.units),
        reject_counts=reject_counts,
        reject_files=reject_files,
        too_many_rejects=too_many,
        started=started,
        finished=time.time(),
        hot_shards=hot.shards,
        hot_units=sum(len(p) for p in hot.positions.values()),
        hot_keys_unmatched=hot.unmatched,
    )
    (work / PLAN_INFO).write_bytes(json.dumps(info.__dict__).encode(), durable=True)
    return [] if too_many or not plan.num_shards else files


@dataclass
class HotChoice:
    """The hot set: per source file, the positions of its hot units; their bucket totals."""

    positions: dict[str, np.ndarray] = field(default_factory=dict)
    units: list[BucketTotal] = field(default_factory=list)  # one per hot unit, original bucket
    unmatched: int = 0
    shards: int = 0

    def split(self, totals: list[BucketTotal]) -> tuple[list[BucketTotal], list[BucketTotal]]:
        """``(hot, rest)`` bucket totals: hot units move to their :func:`hot_bucket`."""
        rest: dict[int, BucketTotal] = {}
        for total in totals:
            rest[total.bucket] = rest[total.bucket] + total if total.bucket in rest else total
        hot: dict[int, BucketTotal] = {}
        for unit in self.units:
            b = rest[unit.bucket]
            rest[unit.bucket] = BucketTotal(
                b.bucket, b.units - 1, b.rows - unit.rows, b.bytes - unit.bytes
            )
            moved = BucketTotal(hot_bucket(unit.bucket), 1, unit.rows, unit.bytes)
            hot[moved.bucket] = hot[moved.bucket] + moved if moved.bucket in hot else moved
        return list(hot.values()), [t for t in rest.values() if t.units > 0]


def choose_hot(
    work: StorePath, files: Sequence[str], source: object, hot: HotSettings, total_bytes: int
) -> HotChoice:
    """The units with the highest weights whose payload fits the budget (first fit in heat
    order: weight, then smaller, then source order), read from every file's unit table."""
    weight_of = hot.load()
    budget = parse_size_or_share(hot.budget, total_bytes)
    candidates: list[
        tuple[str, int, int, int, int, float]
    ] = []  # file, position, bucket, rows, bytes, w
    matched = 0
    for file in files:
        for unit in read_unit_tuples(_part(work, "units", file)):
            ref = KeyedUnit.from_tuple(unit).ref
            weight = weight_of.get(unit_key(source, ref))
            if weight is None:
                continue
            matched += 1
            if weight > 0:
                candidates.append(
                    (file, ref.position, unit[1], ref.rows, ref.payload_bytes, weight)
                )
    weights = np.array([c[5] for c in candidates], dtype=np.float64)
    sizes = np.array([c[4] for c in candidates], dtype=np.int64)
    chosen = sorted(fill(heat_order(weights, sizes), sizes, budget).tolist())
    choice = HotChoice(unmatched=len(weight_of) - matched)
    by_file: dict[str, list[int]] = {}
    for i in chosen:
        file, position, bucket, rows, nbytes, _ = candidates[i]
        by_file.setdefault(file, []).append(position)
        choice.units.append(BucketTotal(bucket, 1, rows, nbytes))
    choice.positions = {f: np.array(sorted(p), dtype=np.int64) for f, p in by_file.items()}
    return choice


def load_hot_weights(path: str) -> dict[str, float]:
    """``key -> weight`` from a ``key,weight`` file; a key named twice is an error."""
    keys, values = read_pairs(path, "key", "weight", str)
    weights = dict(zip(keys, values.tolist(), strict=True))
    if len(weights) != len(keys):
        raise ShardfeedError(f"{path}: a key appears twice")
    return weights


def save_hot_positions(work: StorePath, positions: dict[str, np.ndarray]) -> None:
    for file, values in positions.items():
        buffer = io.BytesIO()
        np.save(buffer, values, allow_pickle=False)
        work_part(work, "hot", file, ".npy").write_bytes(buffer.getvalue())


def hot_positions(work: StorePath, file: str) -> np.ndarray:
    """Positions of ``file``'s hot units (sorted), empty when it has none."""
    try:
        data = work_part(work, "hot", file, ".npy").read_bytes()
    except FileNotFoundError:
        return np.zeros(0, dtype=np.int64)
    return np.load(io.BytesIO(data), allow_pickle=False)


def read_plan_info(work: StorePath) -> PlanInfo | None:
    """``plan.json`` if the plan step ran, else None."""
    try:
        return PlanInfo(**json.loads((work / PLAN_INFO).read_bytes()))
    except FileNotFoundError:
        return None


def load_plan(work: StorePath) -> Plan:
    """The saved plan, loaded once per process and work dir (the writers call this per element)."""
    stamp = (work / _SHUFFLED).stamp()
    return _load_plan(work, stamp)


@functools.lru_cache(maxsize=4)
def _load_plan(work: StorePath, shuffled_stamp: int | None) -> Plan:
    if shuffled_stamp is not None:
        data = io.BytesIO((work / _SHUFFLED).read_bytes())
        with np.load(data, allow_pickle=False) as arrays:
            return ShardPlan(
                dict(zip(arrays["buckets"].tolist(), arrays["shards"].tolist(), strict=True)),
                tuple(arrays["rows"].tolist()),
                tuple(arrays["units"].tolist()),
                tuple(arrays["bytes"].tolist()),
            )
    state = json.loads((work / _CONTIGUOUS).read_bytes())
    return ContiguousPlan(
        state["file_offsets"],
        state["total_bytes"],
        tuple(state["compact"]),
        tuple(state["rows"]),
        tuple(state["units"]),
        tuple(state["bytes"]),
    )


def _save_plan(work: StorePath, plan: Plan) -> None:
    if isinstance(plan, ShardPlan):
        buffer = io.BytesIO()
        buckets, shards = plan.bucket_arrays
        np.savez(
            buffer,
            buckets=buckets,
            shards=shards,
            rows=np.asarray(plan.rows, dtype=np.int64),
            units=np.asarray(plan.units, dtype=np.int64),
            bytes=np.asarray(plan.bytes, dtype=np.int64),
        )
        (work / _SHUFFLED).write_bytes(buffer.getvalue())
        return
    state = {
        "file_offsets": plan.file_offsets,
        "total_bytes": plan.total_bytes,
        "compact": list(plan.compact),
        "rows": list(plan.rows),
        "units": list(plan.units),
        "bytes": list(plan.bytes),
    }
    (work / _CONTIGUOUS).write_bytes(json.dumps(state).encode())


def read_bucket_totals(work: StorePath, files: Sequence[str]) -> list[BucketTotal]:
    """Every bucket's totals over ``files`` (see :func:`read_bucket_arrays`), as objects."""
    return totals_from_arrays(*read_bucket_arrays(work, files))


def read_bucket_arrays(
    work: StorePath, files: Sequence[str]
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(buckets, units, rows, bytes) over ``files``: fine buckets are merged one file at a time
    into dense per-bucket arrays, so memory is bounded by the bucket count; oversized units'
    own buckets (one unit each) are appended as they are."""
    dense = np.zeros((3, FINE_BUCKETS), dtype=np.int64)  # units, rows, bytes
    big: list[np.ndarray] = []
    for file in files:
        table = read_totals(_part(work, "totals", file))
        buckets = table.column("bucket").to_numpy()
        values = np.stack([table.column(n).to_numpy() for n in ("units", "rows", "bytes")])
        small = buckets < FINE_BUCKETS
        for k in range(3):
            np.add.at(dense[k], buckets[small].astype(np.int64), values[k][small])
        if not small.all():
            big.append(np.vstack([buckets[~small].astype(np.int64), values[:, ~small]]))
    used = np.flatnonzero(dense[0])
    fine = np.vstack([used, dense[:, used]])
    both = np.hstack([fine, *big]) if big else fine
    return both[0].astype(np.uint64), both[1], both[2], both[3]


def collect_rejects(work: StorePath) -> tuple[list[str], dict[str, int]]:
    """The scan's reject parts (names, sorted) and their counts by reason."""
    directory = work / "rejects"
    names = [n for n in directory.names() if n.endswith(".jsonl") and not n.startswith(".")]
    counts: dict[str, int] = {}
    for name in names:
        for line in (directory / name).read_bytes().splitlines():
            reject = RejectRecord.from_json(json.loads(line))
            counts[reject.reason] = counts.get(reject.reason, 0) + 1
    return names, dict(sorted(counts.items()))


def _file_bytes(work: StorePath, file: str) -> int:
    return int(pc.sum(read_totals(_part(work, "totals", file)).column("bytes")).as_py() or 0)


def _part(work: StorePath, kind: str, file: str) -> StorePath:
    return work_part(work, kind, file, UNIT_SUFFIX)
