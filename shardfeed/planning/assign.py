"""Per-rank assignment of one epoch: equal samples per rank, balanced bytes, node-local reads.

For each epoch, and all nodes at once:
1. each node's home rows (:mod:`node_sets`, the same every epoch) are cut into pieces, which
   take a seeded per-epoch order (shards, then pieces within a shard);
2. the node's stream is cut to exactly ``gpus_per_node * samples_per_rank`` rows: ``drop`` leaves
   the tail of that order out (a different tail each epoch), ``pad`` repeats its head;
3. the pieces go to the node's ranks, so every rank gets the same rows and near-equal bytes:
   - where the row groups are known (and no ``block_rows`` is asked for), a piece is one row
     group and goes whole to one rank (:mod:`whole_pieces`); only the few pieces cut to make
     the counts exact are shared, so ranks rarely decode the same group;
   - otherwise, or where that would break the bytes balance, pieces are at most ``block_rows``
     rows (the row groups' bounds kept when known), the stream is cut into ``blocks_per_rank``
     equal-row blocks per rank, and blocks are dealt largest first within size classes;
4. each rank reads its pieces in stream order, which keeps reads within a shard together, and
   its stream is split into contiguous runs of whole batches, one per loader worker.
Everything is a pure function of the input spans, sizes, world, policy, seed and epoch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from shardfeed.planning.node_sets import NodeHomes, node_homes
from shardfeed.planning.spans import (
    RowBytes,
    Spans,
    cut_at,
    group_arange,
    merge_adjacent,
    refine,
    split_near,
    split_rows,
)
from shardfeed.planning.stable_random import random_keys
from shardfeed.planning.whole_pieces import deal_whole

#: changes whenever the same inputs give another plan (2: pieces follow row groups; 3: row
#: groups are dealt whole), so a loader refuses to resume a state whose in-memory plan came
#: from another planner
PLANNER_VERSION = 3
PAD, DROP = "pad", "drop"
MODES = (PAD, DROP)
DEFAULT_BLOCK_BYTES = 4 << 20  # one row group of payload: a block is one efficient read
MIN_BLOCKS_PER_RANK = 64  # bytes balance is per block; fewer blocks per rank cannot reach 1.02
BYTES_BALANCE = 1.02  # per-rank bytes max/mean a plan keeps to (docs/ASSIGNMENT.md, Guarantees)
_GREEDY_BLOCKS = 4096  # per node: up to this many blocks, every block is dealt greedily
_GREEDY_STRATA = 64  # beyond it, the last strata of blocks per rank still are
#: dealing row groups whole, groups are cut to at most about per_rank // d rows, trying each d
#: in turn until bytes balance
_WHOLE_SPLITS = (1, 4, 16)


@dataclass(frozen=True)
class World:
    """The training job's shape: ``nodes`` x ``gpus_per_node`` ranks, each with ``workers``
    loader workers. Rank ``r`` runs on node ``r // gpus_per_node``."""

    nodes: int
    gpus_per_node: int
    workers: int = 1

    def __post_init__(self) -> None:
        for name in ("nodes", "gpus_per_node", "workers"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")

    @property
    def ranks(self) -> int:
        return self.nodes * self.gpus_per_node


@dataclass(frozen=True)
class Policy:
    """How an epoch is cut: ``pad`` repeats samples so all are read, ``drop`` leaves a few out;
    ``batch_size`` makes every rank's count a whole number of batches; ``block_rows`` is the
    shuffle and read unit (None: about one row group of payload)."""

    mode: str = PAD
    batch_size: int | None = None
    block_rows: int | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        for name in ("batch_size", "block_rows"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be a positive integer or None, got {value!r}")


@dataclass(frozen=True)
class EpochPlan:
    """One epoch's spans, sorted by ``(rank, worker, seq)``, and its counts."""

    epoch: int
    rank: np.ndarray
    worker: np.ndarray
    seq: np.ndarray
    spans: Spans
    home: np.ndarray  # the span's shard is in its node's home shard set
    samples_per_rank: int
    dropped: int
    padded: int
    block_rows: int

    def __len__(self) -> int:
        return len(self.spans)


def samples_per_rank(num_samples: int, ranks: int, mode: str, batch_size: int | None) -> int:
    """Each rank's sample count: rounded down (``drop``) or up (``pad``) to whole batches."""
    unit = ranks * (batch_size or 1)
    batches = num_samples // unit if mode == DROP else -(-num_samples // unit)
    return batches * (batch_size or 1)


def block_rows_for(per_rank: int, mean_row_bytes: float, requested: int | None) -> int:
    """The block size in rows: ``requested`` or about one row group of payload, capped so each
    rank gets at least ``MIN_BLOCKS_PER_RANK`` blocks (the cap is what makes bytes balance)."""
    wanted = requested or max(1, round(DEFAULT_BLOCK_BYTES / max(mean_row_bytes, 1.0)))
    return max(1, min(wanted, per_rank // MIN_BLOCKS_PER_RANK))


def plan_epoch(
    sequence: Spans,
    row_bytes: RowBytes,
    world: World,
    policy: Policy,
    epoch: int,
    homes: NodeHomes | None = None,
) -> EpochPlan:
    """Assign the rows of ``sequence`` to every (rank, worker) of ``world`` for ``epoch``.

    ``homes`` (from :func:`plan_homes`) may be passed to reuse node sets across epochs.
    """
    total = sequence.total_rows
    per_rank = samples_per_rank(total, world.ranks, policy.mode, policy.batch_size)
    if per_rank == 0:
        raise ValueError(
            f"{total} samples cannot give each of {world.ranks} ranks a "
            f"{'batch' if policy.batch_size else 'sample'} with mode={policy.mode!r}; use pad"
        )
    if total < world.nodes:
        raise ValueError(f"{total} samples are fewer than the {world.nodes} nodes")
    if homes is None:
        homes, block = plan_homes(sequence, row_bytes, world, policy)
    else:
        block = block_rows_for(per_rank, _mean(sequence, row_bytes), policy.block_rows)
    dealt = None
    if row_bytes.groups is not None and policy.block_rows is None:
        dealt = _whole_groups(homes, row_bytes, world, per_rank, policy.seed, epoch)
    if dealt is None:
        dealt = _blocks(homes, row_bytes, world, per_rank, block, policy.seed, epoch)
    segments, rank, held, unit = dealt
    quota = world.gpus_per_node * per_rank
    spans, part = _split_workers(segments, world, per_rank, policy.batch_size)
    spans, part = merge_adjacent(spans, part)
    counts = np.bincount(part, minlength=world.ranks * world.workers)
    rank = part // world.workers
    return EpochPlan(
        epoch=epoch,
        rank=rank,
        worker=part % world.workers,
        seq=group_arange(counts),
        spans=spans,
        home=homes.is_own(rank // world.gpus_per_node, spans.shard),
        samples_per_rank=per_rank,
        dropped=int(np.maximum(held - quota, 0).sum()),
        padded=int(np.maximum(quota - held, 0).sum()),
        block_rows=unit,
    )


def plan_homes(
    sequence: Spans, row_bytes: RowBytes, world: World, policy: Policy
) -> tuple[NodeHomes, int]:
    """The node home sets for ``sequence`` (the same every epoch) and the block size in rows."""
    per_rank = samples_per_rank(sequence.total_rows, world.ranks, policy.mode, policy.batch_size)
    block = block_rows_for(per_rank, _mean(sequence, row_bytes), policy.block_rows)
    return node_homes(sequence, world.nodes, row_bytes), block


#: (segments sorted by rank then stream position, each one's rank, each node's rows before
#: fitting, the shuffle unit in rows)
_Dealt = tuple[Spans, np.ndarray, np.ndarray, int]


def _whole_groups(
    homes: NodeHomes, row_bytes: RowBytes, world: World, per_rank: int, seed: int, epoch: int
) -> _Dealt | None:
    """Pieces of one row group each, dealt whole to ranks (:func:`deal_whole`), so ranks share
    only the few groups cut to make their counts exact. A group over 1.5 x ``per_rank // d``
    rows is cut into near-equal parts, for ``d`` in ``_WHOLE_SPLITS``: the first that keeps
    bytes within ``BYTES_BALANCE`` is taken (few large pieces per rank leave too little to
    balance with). None where none does, or a node holds too many pieces to deal one by one:
    then equal-row blocks are dealt instead."""
    quota = world.gpus_per_node * per_rank
    for split in _WHOLE_SPLITS:
        stream, node = _epoch_order(homes, row_bytes, max(1, per_rank // split), seed, epoch)
        if np.bincount(node, minlength=world.nodes).max(initial=0) > _GREEDY_BLOCKS:
            return None
        home = homes.is_own(node, stream.shard)
        stream, held = _fit_to(stream, node, home, row_bytes, world.nodes, quota)
        weights = row_bytes.of(stream).astype(np.float64)
        segments, rank = deal_whole(stream, weights, world.nodes, world.gpus_per_node, per_rank)
        load = np.bincount(rank, weights=row_bytes.of(segments), minlength=world.ranks)
        if load.max(initial=0) <= BYTES_BALANCE * load.mean():
            return segments, rank, held, max(1, round(quota * world.nodes / max(len(stream), 1)))
    return None


def _blocks(
    homes: NodeHomes,
    row_bytes: RowBytes,
    world: World,
    per_rank: int,
    block: int,
    seed: int,
    epoch: int,
) -> _Dealt:
    """Pieces of at most about ``block`` rows; each node's stream cut into equal-row blocks,
    ``per_rank // block`` per rank, dealt by bytes (:func:`_deal`)."""
    stream, node = _epoch_order(homes, row_bytes, block, seed, epoch)
    quota = world.gpus_per_node * per_rank
    home = homes.is_own(node, stream.shard)
    stream, held = _fit_to(stream, node, home, row_bytes, world.nodes, quota)
    blocks_per_rank = per_rank // block
    segments, block_id = _cut_blocks(stream, world, per_rank, blocks_per_rank)
    rank_of_block = _deal(row_bytes, segments, block_id, world, per_rank, blocks_per_rank)
    rank = rank_of_block[block_id]
    order = np.lexsort((np.arange(len(segments)), rank))
    return segments.take(order), rank[order], held, per_rank // blocks_per_rank


def _mean(sequence: Spans, row_bytes: RowBytes) -> float:
    return float(row_bytes.of(sequence).sum()) / max(1, sequence.total_rows)


def _epoch_order(
    homes: NodeHomes, row_bytes: RowBytes, block: int, seed: int, epoch: int
) -> tuple[Spans, np.ndarray]:
    """Each node's home rows as pieces in this epoch's order. Where the row groups are known a
    piece is one row group, or a near-equal part of one far larger than ``block``, so a reader
    decodes each group it reads once; otherwise pieces of at most ``block`` rows."""
    if row_bytes.groups is None:
        pieces, source = split_rows(homes.spans, block)
    else:
        in_groups, source = cut_at(homes.spans, row_bytes.groups, row_bytes.offsets)
        pieces, part = split_near(in_groups, block)
        source = source[part]
    node = homes.node[source]
    shard_key = random_keys((seed, epoch, 1), pieces.shard)
    piece_key = random_keys((seed, epoch, 2), pieces.shard, pieces.start)
    order = np.lexsort((piece_key, shard_key, node))
    return pieces.take(order), node[order]


def _fit_to(
    stream: Spans,
    node: np.ndarray,
    home: np.ndarray,
    row_bytes: RowBytes,
    nodes: int,
    quota: int,
) -> tuple[Spans, np.ndarray]:
    """Exactly ``quota`` rows per node: its stream cut short, or followed by repeats while
    short. Repeats take home-set pieces first (a node-local read) and, among those, pieces
    whose bytes per row are nearest the mean, so padding never tips a rank's balance.

    Returns the node-major stream (node ``n`` at rows ``[n * quota, (n + 1) * quota)``) and each
    node's row count before fitting."""
    held = np.bincount(node, weights=stream.rows, minlength=nodes).astype(np.int64)
    pieces = np.bincount(node, minlength=nodes)
    first = np.cumsum(pieces) - pieces
    repeats = np.maximum(1, -(-quota // np.maximum(held, 1)))
    counts = pieces * repeats
    owner = np.repeat(np.arange(nodes), counts)
    within = group_arange(counts)
    index = first[owner] + within % pieces[owner]
    padding = within >= pieces[owner]
    density = row_bytes.of(stream) / np.maximum(stream.rows, 1)
    distance = np.abs(density - density.mean()) if len(density) else density
    pad_order = np.lexsort((np.arange(len(stream)), distance, ~home, node))
    index[padding] = pad_order[index[padding]]
    tiled = stream.take(index)
    starts = np.cumsum(held * repeats) - held * repeats
    keep = np.stack([starts, starts + quota], axis=1).reshape(-1)
    fitted, part, _ = refine(tiled, keep)
    return fitted.take(np.flatnonzero(part % 2 == 0)), held


def _cut_blocks(
    stream: Spans, world: World, per_rank: int, blocks_per_rank: int
) -> tuple[Spans, np.ndarray]:
    """Cut each node's ``quota`` rows into ``gpus * blocks_per_rank`` blocks: the first
    ``gpus * extra`` of ``base + 1`` rows, the rest of ``base`` rows."""
    gpus = world.gpus_per_node
    base, extra = divmod(per_rank, blocks_per_rank)
    big = np.arange(gpus * extra) * (base + 1)
    small = gpus * extra * (base + 1) + np.arange(gpus * (blocks_per_rank - extra)) * base
    local = np.concatenate([big, small])
    quota = gpus * per_rank
    cuts = (np.arange(world.nodes)[:, None] * quota + local[None, :]).reshape(-1)
    segments, block_id, _ = refine(stream, np.r_[cuts, world.nodes * quota])
    return segments, block_id


def _deal(
    row_bytes: RowBytes,
    segments: Spans,
    block_id: np.ndarray,
    world: World,
    per_rank: int,
    blocks_per_rank: int,
) -> np.ndarray:
    """Global rank of every block, for all nodes at once.

    Largest first, each block goes to the node's lightest rank that still has room in its size
    class (LPT with a cardinality cap), so a rank holding a large block ends with the smallest
    ones. With many blocks per rank the large head is first dealt in snake-ordered strata of
    one block per rank, and only the last ``_GREEDY_STRATA`` strata go greedy.
    """
    nodes, gpus = world.nodes, world.gpus_per_node
    per_node = gpus * blocks_per_rank
    weights = row_bytes.of(segments).astype(np.float64)
    block_bytes = np.bincount(block_id, weights=weights, minlength=nodes * per_node)
    block_bytes = block_bytes.reshape(nodes, per_node)
    extra = per_rank % blocks_per_rank
    room = np.zeros((nodes, 2, gpus), dtype=np.int64)  # blocks each rank still takes per class
    room[:, 0, :], room[:, 1, :] = extra, blocks_per_rank - extra
    size_class = (np.arange(per_node) >= gpus * extra).astype(np.int64)
    local_rank = np.full((nodes, per_node), -1, dtype=np.int64)
    rows = np.arange(nodes)[:, None]
    lanes = np.arange(gpus)
    greedy = blocks_per_rank if per_node <= _GREEDY_BLOCKS else _GREEDY_STRATA
    if greedy < blocks_per_rank:  # snake the large head of the bigger class in strata
        lo = gpus * extra
        order = np.argsort(-block_bytes[:, lo:], axis=1, kind="stable") + lo
        strata = (blocks_per_rank - extra) - greedy
        for s in range(strata):
            local_rank[rows, order[:, s * gpus : (s + 1) * gpus]] = (
                lanes if s % 2 == 0 else lanes[::-1]
            )
        room[:, 1, :] -= strata
    dealt = local_rank >= 0
    flat = (rows * gpus + np.where(dealt, local_rank, 0)).reshape(-1)
    load = np.bincount(flat, (block_bytes * dealt).reshape(-1), nodes * gpus).reshape(nodes, gpus)
    pending = np.where(dealt, -np.inf, block_bytes)
    order = np.argsort(-pending, axis=1, kind="stable")[:, : int((~dealt).sum(axis=1).max())]
    for p in range(order.shape[1]):
        block = order[:, p]
        cls = size_class[block]
        free = room[np.arange(nodes), cls, :] > 0
        rank = np.argmin(np.where(free, load, np.inf), axis=1)
        local_rank[np.arange(nodes), block] = rank
        load[np.arange(nodes), rank] += block_bytes[np.arange(nodes), block]
        room[np.arange(nodes), cls, rank] -= 1
    return (rows * gpus + local_rank).reshape(-1)


def _split_workers(
    stream: Spans, world: World, per_rank: int, batch_size: int | None
) -> tuple[Spans, np.ndarray]:
    """Cut each rank's ``per_rank`` rows into one contiguous run of whole batches per worker."""
    batch = batch_size or 1
    batches = per_rank // batch
    local = (np.arange(world.workers) * batches // world.workers) * batch
    cuts = (np.arange(world.ranks)[:, None] * per_rank + local[None, :]).reshape(-1)
    spans, part, _ = refine(stream, np.r_[cuts, world.ranks * per_rank])
    return spans, part
