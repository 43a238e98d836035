"""Size-aware batches for an assignment: every rank's samples packed into batches under a cost
budget (tokens, pixels, frames or bytes per batch), with the same number of steps on every rank.

Reads the per-sample costs from ``meta/shardfeed/samples.parquet`` (recorded at conversion, see
``formats/cost.py``) and each (rank, worker)'s spans from the assignment; the packing itself is
``shardfeed.planning.batching``. No Beam import; see "Size-aware batching" in
``docs/ASSIGNMENT.md``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property
from typing import overload

import numpy as np

from shardfeed.assignment import Assignment, load_assignment
from shardfeed.formats.reader import Dataset, load_manifest
from shardfeed.formats.sample_index import read_sample_cost
from shardfeed.formats.storage import locate
from shardfeed.planning.batching import (
    OVERSIZE,
    BatchingError,
    OversizeError,
    plan_batches,
)
from shardfeed.planning.spans import Spans, group_arange, refine

__all__ = [
    "OVERSIZE",
    "BatchingError",
    "OversizeError",
    "RankBatches",
    "WorkerBatches",
    "cost_batches",
]


@dataclass(frozen=True)
class WorkerBatches:
    """One loader worker's batches in an epoch, in reading order.

    ``spans`` are the worker's spans from the assignment; its *stream* is their rows in order.
    Batch ``i`` is stream positions ``[bounds[i], bounds[i + 1])`` and costs ``cost[i]``.
    ``offsets[s]`` is shard ``s``'s first global sample index (then ``num_samples``).
    """

    spans: Spans
    bounds: np.ndarray
    cost: np.ndarray
    offsets: np.ndarray

    def __len__(self) -> int:
        return len(self.bounds) - 1

    def __iter__(self) -> Iterator[Spans]:
        """Each batch as spans ``(shard, start, end)``, in order: a contiguous read per span."""
        return (self.batch(i) for i in range(len(self)))

    def batch(self, i: int) -> Spans:
        """Batch ``i`` as spans of rows (split where the worker's spans or the batch end)."""
        if not 0 <= i < len(self):
            raise IndexError(f"batch {i} is outside the worker's {len(self)} batches")
        pieces, first = self._pieces
        return pieces.take(np.arange(first[i], first[i + 1]))

    def sample_ids(self) -> np.ndarray:
        """Global sample indices of the stream (int64); batch ``i`` is
        ``sample_ids()[bounds[i]:bounds[i + 1]]``."""
        return _global_ids(self.spans, self.offsets)

    @cached_property
    def _pieces(self) -> tuple[Spans, np.ndarray]:
        if len(self) == 0:
            return Spans.empty(), np.zeros(1, dtype=np.int64)
        pieces, part, _ = refine(self.spans, self.bounds)
        return pieces, np.searchsorted(part, np.arange(len(self) + 1), side="left")


@dataclass(frozen=True)
class RankBatches:
    """One rank's batches in an epoch, per loader worker. ``steps`` (the sum over workers) is
    the same on every rank of the assignment; ``kind`` is what ``max_cost`` and ``cost`` count."""

    rank: int
    epoch: int
    kind: str
    max_cost: int
    workers: tuple[WorkerBatches, ...]

    @property
    def steps(self) -> int:
        return sum(len(w) for w in self.workers)

    def loader_order(self) -> Iterator[tuple[int, int]]:
        """``(worker, batch)`` in the order a ``DataLoader`` delivers them: round robin over the
        workers, worker 0 first, skipping workers that are done."""
        for i in range(max((len(w) for w in self.workers), default=0)):
            for worker, batches in enumerate(self.workers):
                if i < len(batches):
                    yield worker, i


@overload
def cost_batches(
    dataset: Dataset | str | os.PathLike[str],
    assignment: Assignment | str,
    epoch: int,
    max_cost: int,
    *,
    rank: int,
    oversize: str = "error",
) -> RankBatches: ...


@overload
def cost_batches(
    dataset: Dataset | str | os.PathLike[str],
    assignment: Assignment | str,
    epoch: int,
    max_cost: int,
    *,
    rank: None = None,
    oversize: str = "error",
) -> tuple[RankBatches, ...]: ...


def cost_batches(
    dataset: Dataset | str | os.PathLike[str],
    assignment: Assignment | str,
    epoch: int,
    max_cost: int,
    *,
    rank: int | None = None,
    oversize: str = "error",
) -> RankBatches | tuple[RankBatches, ...]:
    """Batches of ``epoch`` whose cost stays within ``max_cost``, for ``rank`` (or every rank).

    ``assignment`` is a loaded :class:`Assignment` of ``dataset`` or the name of one saved in
    it. ``max_cost`` counts what the dataset's cost counts (``manifest.cost.kind``: tokens,
    pixels, frames or bytes). Each (rank, worker) stream is cut into batches of consecutive
    samples; every rank gets the same number of steps, summed over its workers. Every rank's
    samples are read to find that number, so ``rank=`` saves only the splitting of other
    ranks. A sample costlier than ``max_cost`` raises :class:`OversizeError` naming its global
    index, or (``oversize="alone"``) forms a batch alone.
    """
    if isinstance(dataset, Dataset):
        location, manifest = dataset.location, dataset.manifest
    else:
        location = locate(dataset)
        manifest = load_manifest(location)
    plan_of = load_assignment(dataset, assignment) if isinstance(assignment, str) else assignment
    if plan_of.header.dataset.fingerprint != manifest.fingerprint:
        raise BatchingError(
            f"assignment {plan_of.name!r} was planned for dataset "
            f"{plan_of.header.dataset.fingerprint}, not this one, {manifest.fingerprint}"
        )
    costs = read_sample_cost(location, manifest).astype(np.int64)  # checks manifest.cost is set
    rows = np.array([s.rows for s in manifest.shards], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(rows)]).astype(np.int64)
    world = plan_of.world
    spans = [[plan_of.spans(r, w, epoch) for w in range(world.workers)] for r in range(world.ranks)]
    ids = [[_global_ids(s, offsets) for s in per_rank] for per_rank in spans]
    streams = [[costs[i] for i in per_rank] for per_rank in ids]
    wanted = None if rank is None else [rank]
    try:
        plan = plan_batches(streams, max_cost, oversize=oversize, ranks=wanted)
    except OversizeError as err:  # name the sample by its global index
        sample = int(ids[err.rank][err.worker][err.position])
        args = (err.rank, err.worker, err.position, err.cost, err.max_cost)
        raise OversizeError(*args, sample=sample) from None
    kind = manifest.cost.kind
    out = tuple(
        RankBatches(
            r,
            epoch,
            kind,
            int(max_cost),
            tuple(
                WorkerBatches(s, b, np.add.reduceat(c, b[:-1]) if len(c) else c[:0], offsets)
                for s, b, c in zip(spans[r], plan.bounds[r], streams[r], strict=True)
            ),
        )
        for r in sorted(plan.bounds)
    )
    return out if rank is None else out[0]


def _global_ids(spans: Spans, offsets: np.ndarray) -> np.ndarray:
    a, _ = spans.to_global(offsets)
    return np.repeat(a, spans.rows) + group_arange(spans.rows)
