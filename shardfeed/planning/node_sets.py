"""Node home sets: which rows each node reads, fixed across epochs so node caches pay off.

The input spans (whole shards, for a fresh plan) are put in an order that keeps the running
bytes close to rows x mean, then cut by row count into ``nodes`` contiguous ranges, so a shard is
split between two nodes only at a cut. Counts then match exactly, and bytes nearly. While a node's bytes drift more than ``tolerance`` from the
mean, the heaviest and the lightest node swap one sample each, the pair that evens them out best.
A received sample comes from a shard outside the node's set, so each node receives at most
``max_exchange`` of its bytes that way. A node's *shard set* is the shards its range touches; the
share of a node's bytes read from that set is its affinity.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from shardfeed.planning.spans import RowBytes, Spans, merge_adjacent, refine, sorted_unique

DEFAULT_TOLERANCE = 0.003  # node bytes within 0.3% of the mean: leaves room for rank balance
DEFAULT_MAX_EXCHANGE = 0.08  # keeps affinity at or above about 0.92
_CANDIDATES = 64  # smallest samples of the light node tried per swap
_MAX_CANDIDATES = 1 << 16  # samples per node considered for swaps


@dataclass(frozen=True)
class NodeHomes:
    """Every node's home rows (node-major spans) and its shard set."""

    spans: Spans
    node: np.ndarray  # node of each span
    own: np.ndarray  # sorted keys ``node * num_shards + shard`` of each node's shard set
    num_shards: int

    def is_own(self, node: np.ndarray, shard: np.ndarray) -> np.ndarray:
        """Whether ``shard`` is in the shard set of ``node`` (elementwise)."""
        keys = np.asarray(node, dtype=np.int64) * self.num_shards + shard
        i = np.searchsorted(self.own, keys).clip(0, max(0, len(self.own) - 1))
        return self.own[i] == keys if len(self.own) else np.zeros(len(keys), bool)


def node_homes(
    sequence: Spans,
    nodes: int,
    row_bytes: RowBytes,
    *,
    tolerance: float = DEFAULT_TOLERANCE,
    max_exchange: float = DEFAULT_MAX_EXCHANGE,
) -> NodeHomes:
    """Split ``sequence`` into ``nodes`` home sets of equal rows and, within ``tolerance``,
    equal bytes."""
    total = sequence.total_rows
    bounds = np.arange(nodes + 1, dtype=np.int64) * total // nodes
    num_shards = len(row_bytes.offsets) - 1
    if nodes > 1:
        sequence = sequence.take(_level_order(sequence, row_bytes))
    pieces, node, _ = refine(sequence, bounds)
    own = sorted_unique(node * num_shards + pieces.shard)
    if nodes > 1 and total:
        moves = _swaps(pieces, node, bounds, row_bytes, tolerance, max_exchange)
        if len(moves[0]):
            pieces, node = _apply(pieces, bounds, *moves)
    pieces, node = merge_adjacent(pieces, node)
    return NodeHomes(pieces, node, own, num_shards)


def _level_order(sequence: Spans, row_bytes: RowBytes) -> np.ndarray:
    """An order of the spans (shards) that keeps the running bytes close to rows x mean, so
    equal-count ranges get near-equal bytes: after a dense span comes a sparse one."""
    nbytes = row_bytes.of(sequence).astype(np.float64)
    rows = sequence.rows.astype(np.float64)
    excess = nbytes - rows * (nbytes.sum() / max(rows.sum(), 1.0))
    dense = [int(i) for i in np.argsort(-excess, kind="stable") if excess[i] > 0]
    sparse = [int(i) for i in np.argsort(excess, kind="stable") if excess[i] <= 0]
    order, running, d, p = [], 0.0, 0, 0
    while d < len(dense) or p < len(sparse):
        if p == len(sparse) or (d < len(dense) and running <= 0):
            order.append(dense[d])
            d += 1
        else:
            order.append(sparse[p])
            p += 1
        running += excess[order[-1]]
    return np.asarray(order, dtype=np.int64)


class _NodeRows:
    """A node's swap candidates by size, computed on first use: every sample of a node up to
    ``_MAX_CANDIDATES``, else an evenly strided subset, so memory stays bounded."""

    def __init__(self, pieces: Spans, row_bytes: RowBytes, first: int) -> None:
        bounds = np.concatenate([[0], np.cumsum(pieces.rows)])
        stride = max(1, -(-int(bounds[-1]) // _MAX_CANDIDATES))
        local = np.arange(0, bounds[-1], stride)
        piece = np.searchsorted(bounds, local, side="right") - 1
        rows = row_bytes.offsets[pieces.shard[piece]] + pieces.start[piece] + local - bounds[piece]
        sizes = row_bytes.prefix[rows + 1] - row_bytes.prefix[rows]
        order = np.argsort(sizes, kind="stable")
        self.position = first + local[order]
        self.size = sizes[order].astype(np.float64)

    def pop(self, i: int) -> int:
        position = int(self.position[i])
        self.position = np.delete(self.position, i)
        self.size = np.delete(self.size, i)
        return position


def _swaps(
    pieces: Spans,
    node: np.ndarray,
    bounds: np.ndarray,
    row_bytes: RowBytes,
    tolerance: float,
    max_exchange: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Sample swaps that even out node bytes: sequence positions and their new nodes."""
    nodes = len(bounds) - 1
    loads = np.bincount(node, weights=row_bytes.of(pieces), minlength=nodes)
    rows = np.diff(bounds).astype(np.float64)
    excess = loads - rows * (loads.sum() / rows.sum())
    limit = tolerance * loads.mean()
    allowance = max_exchange * loads  # bytes each node may still receive from other shard sets
    cache: dict[int, _NodeRows] = {}

    def samples(n: int) -> _NodeRows:
        if n not in cache:
            cache[n] = _NodeRows(pieces.take(node == n), row_bytes, int(bounds[n]))
        return cache[n]

    moved_positions, moved_to = [], []
    active = np.ones(nodes, dtype=bool)
    for _ in range(1000 * nodes):
        heavy = int(np.argmax(np.where(active, excess, -np.inf)))
        light = int(np.argmin(np.where(active, excess, np.inf)))
        if heavy == light or max(excess[heavy], -excess[light]) <= limit:
            break
        pair = _best_pair(samples(heavy), samples(light), excess, heavy, light, allowance)
        if pair is None:  # this pair cannot improve; leave the worse side as it is
            active[heavy if excess[heavy] >= -excess[light] else light] = False
            continue
        give, take = samples(heavy).size[pair[0]], samples(light).size[pair[1]]
        moved_positions += [samples(heavy).pop(pair[0]), samples(light).pop(pair[1])]
        moved_to += [light, heavy]
        excess[heavy] -= give - take
        excess[light] += give - take
        allowance[light] -= give
        allowance[heavy] -= take
    return np.asarray(moved_positions, dtype=np.int64), np.asarray(moved_to, dtype=np.int64)


def _best_pair(
    heavy_rows: _NodeRows,
    light_rows: _NodeRows,
    excess: np.ndarray,
    heavy: int,
    light: int,
    allowance: np.ndarray,
) -> tuple[int, int] | None:
    """Indices of the heavy node's sample to give and the light node's to take back.

    The light node's smallest samples are tried, each with the heavy sample that best halves
    the gap; the smaller the sample received, the less affinity a swap costs."""
    xs, ys = heavy_rows.size, light_rows.size
    ok_x = np.searchsorted(xs, allowance[light], side="right")  # xs[:ok_x] fit the allowance
    ok_y = min(_CANDIDATES, int(np.searchsorted(ys, allowance[heavy], side="right")))
    if ok_x == 0 or ok_y == 0:
        return None
    gap = excess[heavy] - excess[light]
    y = ys[:ok_y]
    at = np.searchsorted(xs[:ok_x], y + gap / 2)
    options = np.stack([np.clip(at - 1, 0, ok_x - 1), np.clip(at, 0, ok_x - 1)])
    moved = xs[options] - y[None, :]
    after = np.maximum(np.abs(excess[heavy] - moved), np.abs(excess[light] + moved))
    best = int(np.argmin(after))
    if after.flat[best] >= max(excess[heavy], -excess[light]) * (1 - 1e-9):
        return None
    side, j = divmod(best, ok_y)
    return int(options[side, j]), j


def _apply(
    pieces: Spans, bounds: np.ndarray, positions: np.ndarray, owners: np.ndarray
) -> tuple[Spans, np.ndarray]:
    """Home spans after the swaps: each moved sample becomes a one-row span of its new node."""
    order = np.argsort(positions, kind="stable")
    positions, owners = positions[order], owners[order]
    cuts = sorted_unique(np.concatenate([bounds, positions, positions + 1]))
    segments, part, _ = refine(pieces, cuts)
    node = np.searchsorted(bounds, cuts[part], side="right") - 1
    moved = np.searchsorted(positions, cuts[part])
    hit = moved < len(positions)
    hit[hit] = positions[moved[hit]] == cuts[part][hit]
    node[hit] = owners[moved[hit]]
    order = np.lexsort((np.arange(len(segments)), node))
    return segments.take(order), node[order]
