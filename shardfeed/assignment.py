"""Per-rank assignments of a dataset: plan, save, load and resume them (no Beam import).

An assignment says, before a job starts, exactly which rows every (epoch, rank, worker) reads,
as spans. It is stored next to the dataset in ``meta/shardfeed/assignments/NAME.{parquet,json}``
and refuses to load against any other dataset. See ``docs/ASSIGNMENT.md``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

import numpy as np
import pyarrow as pa

from shardfeed.dataset_source import DatasetSource
from shardfeed.formats import assignment_table
from shardfeed.formats.errors import AssignmentError
from shardfeed.formats.reader import Dataset
from shardfeed.formats.store_path import StorePath
from shardfeed.formats.writer_lease import WriterLease
from shardfeed.planning.assign import DROP, PAD, EpochPlan, Policy, World, plan_epoch, plan_homes
from shardfeed.planning.resume import resume_epoch
from shardfeed.planning.spans import RowBytes, Spans
from shardfeed.schemas.assignment import (
    AssignmentHeader,
    EpochCounts,
    PolicyRecord,
    ResumeRecord,
    WorldRecord,
    check_name,
    header_path,
    table_path,
)
from shardfeed.schemas.sidecar import TableRecord
from shardfeed.summary import assignment_summary

__all__ = [
    "DROP",
    "PAD",
    "Assignment",
    "AssignmentError",
    "Policy",
    "Spans",
    "World",
    "assign",
    "load_assignment",
    "plan_assignment",
    "resume",
]


class Assignment:
    """A loaded or freshly planned assignment: its header and its span table in memory."""

    def __init__(
        self, header: AssignmentHeader, columns: dict[str, np.ndarray], source: DatasetSource
    ):
        self.header = header
        self.columns = columns
        self._source = source
        self._sizes: RowBytes | None = None
        w = header.world
        self._key = _group_key(columns["epoch"], columns["rank"], columns["worker"], w)

    @property
    def name(self) -> str:
        return self.header.name

    @property
    def world(self) -> World:
        w = self.header.world
        return World(w.nodes, w.gpus_per_node, w.workers)

    @property
    def policy(self) -> Policy:
        p = self.header.policy
        return Policy(p.mode, p.batch_size, p.block_rows, self.header.seed)

    @property
    def epochs(self) -> tuple[int, ...]:
        return tuple(e.epoch for e in self.header.epochs)

    def spans(self, rank: int, worker: int = 0, epoch: int = 0) -> Spans:
        """The spans ``(shard, start, end)`` worker ``worker`` of ``rank`` reads in ``epoch``,
        in order; ``shard`` is the position in the manifest's ``shards`` list."""
        w = self.header.world
        if not 0 <= rank < w.nodes * w.gpus_per_node:
            raise ValueError(f"rank {rank} is outside the world's {w.nodes * w.gpus_per_node}")
        if not 0 <= worker < w.workers:
            raise ValueError(f"worker {worker} is outside the {w.workers} workers per rank")
        self.header.counts(epoch)  # a clear error for an epoch the assignment does not hold
        key = _group_key(np.int64(epoch), np.int64(rank), np.int64(worker), w)
        lo, hi = np.searchsorted(self._key, [key, key + 1])
        c = self.columns
        return Spans(c["shard"][lo:hi], c["row_start"][lo:hi], c["row_end"][lo:hi])

    def epoch_plan(self, epoch: int) -> EpochPlan:
        """One epoch of the table as an :class:`EpochPlan` (for resume and reports)."""
        counts = self.header.counts(epoch)
        lo, hi = np.searchsorted(self.columns["epoch"], [epoch, epoch + 1])
        c = {k: v[lo:hi] for k, v in self.columns.items()}
        return EpochPlan(
            epoch=epoch,
            rank=c["rank"].astype(np.int64),
            worker=c["worker"].astype(np.int64),
            seq=c["seq"].astype(np.int64),
            spans=Spans(c["shard"], c["row_start"], c["row_end"]),
            home=c["home"],
            samples_per_rank=counts.samples_per_rank,
            dropped=counts.dropped,
            padded=counts.padded,
            block_rows=counts.block_rows,
        )

    def report(self, epoch: int = 0) -> dict:
        """Per-rank samples, exact bytes, spans and home share for ``epoch``, and the balance
        (see :func:`shardfeed.summary.assignment_summary`)."""
        plan = self.epoch_plan(epoch)
        return assignment_summary(plan, self.span_bytes(plan.spans), self.world, self._row_bytes())

    def span_bytes(self, spans: Spans) -> np.ndarray:
        """Exact payload bytes of each span, from the dataset's sample size index."""
        return self._row_bytes().of(spans)

    def _row_bytes(self) -> RowBytes:
        if self._sizes is None:
            self._sizes = self._source.row_bytes()
        return self._sizes

    def save(self, name: str | None = None, *, overwrite: bool = False) -> Assignment:
        """Write the table, then the header, into the dataset (a local directory or an object-store
        prefix; the header is the commit point), holding the dataset's writer lease."""
        name = check_name(name or self.header.name)
        location = self._source.location
        store = StorePath.at(location)
        if not overwrite and (store / header_path(name)).exists():
            raise AssignmentError(
                f"{location.display} already has an assignment named {name!r}; "
                "pick another name or pass overwrite=True (--overwrite)"
            )
        with WriterLease(store, "assign"), store.writing() as (root, written):
            record = assignment_table.write_table(root, name, self.columns)
            header = _replace_table(self.header, name, record)
            assignment_table.write_header(root, header)
            written += [table_path(name), header_path(name)]
        self.header = header
        return self


def plan_assignment(
    dataset: Dataset | str | os.PathLike[str],
    world: World,
    *,
    epochs: int = 1,
    seed: int = 0,
    mode: str = PAD,
    batch_size: int | None = None,
    block_rows: int | None = None,
    name: str = "default",
    progress: Callable[[int], None] | None = None,
    split: str | None = None,
) -> Assignment:
    """Plan ``epochs`` epochs for ``world`` in memory (``save()`` writes it); ``split``: only
    the rows of that named split (``convert --split``), recorded in the header."""
    if epochs < 1:
        raise ValueError(f"epochs must be >= 1, got {epochs}")
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    source = DatasetSource.of(dataset)
    policy = Policy(mode, batch_size, block_rows, seed)
    sequence = source.sequence(split)
    row_bytes = source.row_bytes()
    homes, _ = plan_homes(sequence, row_bytes, world, policy)
    plans = []
    for epoch in range(epochs):
        plans.append(plan_epoch(sequence, row_bytes, world, policy, epoch, homes))
        if progress:
            progress(epoch)
    return _assemble(check_name(name), world, policy, source, plans, resumed_from=None, split=split)


def assign(
    dataset: Dataset | str | os.PathLike[str],
    world: World,
    *,
    name: str,
    overwrite: bool = False,
    **options,
) -> Assignment:
    """Plan (see :func:`plan_assignment`) and save as ``NAME`` in the dataset."""
    check_name(name)
    return plan_assignment(dataset, world, name=name, **options).save(overwrite=overwrite)


def load_assignment(dataset: Dataset | str | os.PathLike[str], name: str) -> Assignment:
    """Load assignment ``name``; refuses one whose table was modified or which was planned
    for a different dataset (fingerprint, samples or shard count differ)."""
    source = DatasetSource.of(dataset)
    header = assignment_table.read_header(source.location, name)
    if header.name != name:
        raise AssignmentError(f"{header_path(name)} names itself {header.name!r}")
    expected = source.ref()
    if header.dataset != expected:
        raise AssignmentError(
            f"assignment {name!r} was planned for dataset {header.dataset.fingerprint} "
            f"({header.dataset.num_samples} samples, {header.dataset.num_shards} shards), "
            f"not this one, {expected.fingerprint} ({expected.num_samples} samples, "
            f"{expected.num_shards} shards); plan it again with shardfeed assign"
        )
    table = assignment_table.read_table(source.location, header)
    return Assignment(header, _numpy_columns(table), source)


def resume(
    assignment: Assignment,
    epoch: int,
    samples_seen_global: int,
    new_world: World | int,
    *,
    name: str | None = None,
) -> Assignment:
    """The rest of ``epoch`` after ``samples_seen_global`` samples (over all ranks), planned
    for ``new_world``: no unconsumed sample is lost or repeated beyond the counted padding
    (``pad``) or dropped remainder (``drop``). An ``int`` world keeps GPUs and workers per
    node. The result is in memory; ``save()`` writes it."""
    old = assignment.world
    if isinstance(new_world, int):
        if new_world % old.gpus_per_node:
            raise ValueError(
                f"{new_world} ranks is not a whole number of {old.gpus_per_node}-GPU nodes; "
                "pass a World"
            )
        new_world = World(new_world // old.gpus_per_node, old.gpus_per_node, old.workers)
    plan = assignment.epoch_plan(epoch)
    if not 0 <= samples_seen_global <= plan.samples_per_rank * old.ranks:
        raise ValueError(
            f"samples_seen_global={samples_seen_global} is outside 0..{plan.samples_per_rank * old.ranks}"
        )
    source = assignment._source
    rest = resume_epoch(
        plan, old, assignment.policy, assignment._row_bytes(), samples_seen_global, new_world
    )
    origin = ResumeRecord(assignment.name, epoch, samples_seen_global, _world_record(old))
    name = check_name(name or f"{assignment.name}.resume-{epoch}-{samples_seen_global}")
    return _assemble(
        name,
        new_world,
        assignment.policy,
        source,
        [rest],
        resumed_from=origin,
        split=assignment.header.split,
    )


def _assemble(
    name: str,
    world: World,
    policy: Policy,
    source: DatasetSource,
    plans: Sequence[EpochPlan],
    resumed_from: ResumeRecord | None,
    split: str | None = None,
) -> Assignment:
    columns = {
        "epoch": np.concatenate([np.full(len(p), p.epoch, dtype=np.int32) for p in plans]),
        "rank": np.concatenate([p.rank for p in plans]).astype(np.int32),
        "worker": np.concatenate([p.worker for p in plans]).astype(np.int32),
        "seq": np.concatenate([p.seq for p in plans]).astype(np.int32),
        "shard": np.concatenate([p.spans.shard for p in plans]).astype(np.int32),
        "row_start": np.concatenate([p.spans.start for p in plans]),
        "row_end": np.concatenate([p.spans.end for p in plans]),
        "home": np.concatenate([p.home for p in plans]),
    }
    header = AssignmentHeader(
        name=name,
        world=_world_record(world),
        seed=policy.seed,
        policy=PolicyRecord(policy.mode, policy.batch_size, policy.block_rows),
        dataset=source.ref(),
        epochs=tuple(
            EpochCounts(p.epoch, p.samples_per_rank, p.dropped, p.padded, p.block_rows, len(p))
            for p in plans
        ),
        table=TableRecord(f"{name}.parquet", len(columns["epoch"]), 0, "0" * 64),
        resumed_from=resumed_from,
        split=split,
    )
    return Assignment(header, columns, source)


def _replace_table(header: AssignmentHeader, name: str, table: TableRecord) -> AssignmentHeader:
    fields = {k: getattr(header, k) for k in header.__dataclass_fields__}
    return AssignmentHeader(**{**fields, "name": name, "table": table})


def _world_record(world: World) -> WorldRecord:
    return WorldRecord(world.nodes, world.gpus_per_node, world.workers)


def _group_key(epoch, rank, worker, world: WorldRecord) -> np.ndarray:
    ranks = np.int64(world.nodes * world.gpus_per_node)
    return (np.asarray(epoch, np.int64) * ranks + rank) * world.workers + worker


def _numpy_columns(table: pa.Table) -> dict[str, np.ndarray]:
    return {name: table.column(name).to_numpy() for name in table.column_names}
