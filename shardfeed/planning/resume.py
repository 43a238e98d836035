"""Elastic resume: the rest of an epoch, re-planned for a different world.

DDP ranks step in lockstep, so after ``samples_seen`` samples in total every rank of the old
world has consumed ``samples_seen / ranks`` of its stream. Within a rank, batches arrive from
its loader workers round robin, worker 0 first, skipping workers that are done (what torch's
``DataLoader`` does), so each worker's consumed prefix is known exactly. The rows no rank has
consumed (padding repeats of consumed rows excluded) are then planned for the new world with
the same policy, seed and epoch.
"""

from __future__ import annotations

import numpy as np

from shardfeed.planning.assign import EpochPlan, Policy, World, plan_epoch
from shardfeed.planning.spans import RowBytes, Spans, from_global, refine, subtract


def worker_rows(per_rank: int, workers: int, batch_size: int | None) -> np.ndarray:
    """Rows each worker of a rank delivers in an epoch (contiguous runs of whole batches)."""
    batch = batch_size or 1
    bounds = np.arange(workers + 1) * (per_rank // batch) // workers
    return np.diff(bounds) * batch


def consumed_per_worker(
    per_rank: int, workers: int, batch_size: int | None, consumed: int
) -> np.ndarray:
    """Rows each worker has delivered once its rank has consumed ``consumed`` samples."""
    if not 0 <= consumed <= per_rank:
        raise ValueError(f"a rank consumed {consumed} samples, outside 0..{per_rank}")
    batch = batch_size or 1
    batches = worker_rows(per_rank, workers, batch_size) // batch
    full, partial = divmod(consumed, batch)
    # rounds: after k rounds of the round robin, sum(min(batches, k)) batches were delivered
    lo, hi = 0, int(batches.max(initial=0))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if np.minimum(batches, mid).sum() <= full:
            lo = mid
        else:
            hi = mid - 1
    taken = np.minimum(batches, lo) * batch
    left = full - int(np.minimum(batches, lo).sum())
    next_in_turn = np.flatnonzero(batches > lo)  # workers still delivering, in turn order
    taken[next_in_turn[:left]] += batch
    if partial:
        taken[next_in_turn[left]] += partial
    return taken


def unconsumed(
    plan: EpochPlan, world: World, batch_size: int | None, samples_seen: int, offsets: np.ndarray
) -> Spans:
    """The epoch's distinct rows no rank has consumed after ``samples_seen`` samples in total,
    as spans in global order. ``plan`` is the old world's epoch."""
    if samples_seen % world.ranks:
        raise ValueError(
            f"samples_seen={samples_seen} is not a multiple of the {world.ranks} ranks "
            "(every rank consumes the same number of samples per step)"
        )
    done = consumed_per_worker(
        plan.samples_per_rank, world.workers, batch_size, samples_seen // world.ranks
    )
    per_worker = worker_rows(plan.samples_per_rank, world.workers, batch_size)
    group_rows = np.tile(per_worker, world.ranks)
    starts = np.cumsum(group_rows) - group_rows
    cuts = np.stack([starts, starts + np.tile(done, world.ranks)], axis=1).reshape(-1)
    pieces, part, _ = refine(plan.spans, np.r_[cuts, group_rows.sum()])
    a, b = pieces.to_global(offsets)
    seen = part % 2 == 0
    return from_global(*subtract(a[~seen], b[~seen], a[seen], b[seen]), offsets)


def resume_epoch(
    plan: EpochPlan,
    old_world: World,
    policy: Policy,
    row_bytes: RowBytes,
    samples_seen: int,
    new_world: World,
) -> EpochPlan:
    """The rest of ``plan``'s epoch for ``new_world``: no unconsumed row is lost (``pad``) and
    none is repeated beyond the counted padding; ``drop`` leaves out a counted few."""
    rest = unconsumed(plan, old_world, policy.batch_size, samples_seen, row_bytes.offsets)
    if rest.total_rows == 0:  # the epoch was finished
        none = np.zeros(0, dtype=np.int64)
        return EpochPlan(plan.epoch, none, none, none, rest, none.astype(bool), 0, 0, 0, 0)
    return plan_epoch(rest, row_bytes, new_world, policy, plan.epoch)
