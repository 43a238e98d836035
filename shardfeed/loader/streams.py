"""One dataset as a loader worker sees it: its spans for an epoch and their read plan."""

from __future__ import annotations

import os
from dataclasses import dataclass

from shardfeed.assignment import Assignment, load_assignment
from shardfeed.dataset_source import DatasetSource
from shardfeed.formats.reader import Dataset, open_dataset
from shardfeed.loader.reads import GroupIndex, ReadPlan, plan_reads
from shardfeed.planning.assign import PAD, Policy, World, plan_epoch, plan_homes
from shardfeed.planning.spans import RowBytes, Spans


def as_world(world: World | int, num_workers: int) -> World:
    """``world`` as a :class:`World` whose ranks have ``num_workers`` workers; an ``int`` is
    that many single-GPU nodes."""
    if isinstance(world, World):
        if world.workers != num_workers:
            world = World(world.nodes, world.gpus_per_node, num_workers)
        return world
    if not isinstance(world, int) or isinstance(world, bool) or world < 1:
        raise ValueError(f"world must be a positive int or a World, got {world!r}")
    return World(world, 1, num_workers)


def worker_spans(
    dataset: Dataset,
    world: World,
    rank: int,
    worker: int,
    epoch: int,
    *,
    seed: int,
    batch_size: int,
    assignment: Assignment | str | None,
    row_bytes: RowBytes | None = None,
    split: str | None = None,
) -> Spans:
    """The spans ``worker`` of ``rank`` reads in ``epoch``: from a stored or given assignment,
    else planned in memory now (``pad`` policy, whole batches, the same plan every rank
    computes from the same inputs). ``split``: only that named split's shards (a stored
    assignment must have been planned for it)."""
    if not 0 <= rank < world.ranks:
        raise ValueError(f"rank {rank} is outside the world's {world.ranks} ranks")
    if not 0 <= worker < world.workers:
        raise ValueError(f"worker {worker} is outside the {world.workers} workers per rank")
    if assignment is not None:
        if isinstance(assignment, str):
            assignment = load_assignment(dataset, assignment)
        planned = assignment.world
        if planned.ranks != world.ranks or planned.workers != world.workers:
            raise ValueError(
                f"assignment {assignment.name!r} is for {planned.ranks} ranks x "
                f"{planned.workers} workers, not {world.ranks} x {world.workers}"
            )
        if split is not None and assignment.header.split != split:
            raise ValueError(
                f"assignment {assignment.name!r} was planned for "
                + (
                    f"split {assignment.header.split!r}"
                    if assignment.header.split is not None
                    else "the whole dataset"
                )
                + f", not split {split!r}"
            )
        return assignment.spans(rank, worker, epoch)
    source = DatasetSource.of(dataset)
    row_bytes = row_bytes or source.row_bytes()
    policy = Policy(PAD, batch_size, None, seed)
    sequence = source.sequence(split)
    homes, _ = plan_homes(sequence, row_bytes, world, policy)
    plan = plan_epoch(sequence, row_bytes, world, policy, epoch, homes)
    mine = (plan.rank == rank) & (plan.worker == worker)
    return plan.spans.take(mine)


@dataclass
class Stream:
    """A dataset, this worker's spans in it for the epoch, and their read plan."""

    dataset: Dataset
    spans: Spans
    plan: ReadPlan

    @classmethod
    def open(
        cls,
        dataset: Dataset | str | os.PathLike[str],
        world: World,
        rank: int,
        worker: int,
        epoch: int,
        *,
        seed: int,
        batch_size: int,
        assignment: Assignment | str | None,
        split: str | None = None,
        row_bytes: RowBytes | None = None,
    ) -> Stream:
        """``row_bytes``: the dataset's sample sizes, when the caller holds them (a loader
        planning epoch after epoch reads ``samples.parquet`` once)."""
        ds = dataset if isinstance(dataset, Dataset) else open_dataset(dataset)
        row_bytes = row_bytes or DatasetSource.of(ds).row_bytes()
        spans = worker_spans(
            ds,
            world,
            rank,
            worker,
            epoch,
            seed=seed,
            batch_size=batch_size,
            assignment=assignment,
            row_bytes=row_bytes,
            split=split,
        )
        groups = GroupIndex.of([s.row_groups for s in ds.shards])
        return cls(ds, spans, plan_reads(spans, groups, row_bytes, batch_size))
