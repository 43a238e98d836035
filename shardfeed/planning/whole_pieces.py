"""Dealing a node's pieces to its ranks whole, so ranks rarely share a row group.

Cutting a node's stream into equal-row blocks puts a cut inside most row groups once blocks
are about a group's size or smaller, and the two halves go to different ranks: each decodes the
whole group for its half. Here each piece (a row group, see ``assign._epoch_order``) goes whole
to one rank that still has room for its rows. Pieces are taken by how far their bytes stray
from their rows' share of the node's mean, largest first; one heavier than its share goes to
the rank furthest below its share so far, a lighter one to the rank furthest above (greedy
number partitioning, signed). The pieces that fit nowhere are laid end to end in stream order
and cut at each rank's remaining room, so every rank still gets exactly ``per_rank`` rows and
only those few pieces are shared. The caller checks the bytes balance and falls back if needed.
"""

from __future__ import annotations

import numpy as np

from shardfeed.planning.spans import Spans, refine


def deal_whole(
    stream: Spans, weights: np.ndarray, nodes: int, gpus: int, per_rank: int
) -> tuple[Spans, np.ndarray]:
    """Deal the node-major ``stream`` (node ``n`` holds its rows ``[n * q, (n + 1) * q)``,
    ``q = gpus * per_rank``, and no piece straddles two nodes) to the ``nodes * gpus`` ranks.

    ``weights``: each piece's bytes. Returns the segments sorted by (global rank, stream
    position) and each one's global rank; every rank gets exactly ``per_rank`` rows.
    """
    rows = stream.rows
    quota = gpus * per_rank
    node = (np.cumsum(rows) - rows) // quota
    count = np.bincount(node, minlength=nodes)
    within = np.arange(len(stream)) - (np.cumsum(count) - count)[node]
    width = int(count.max(initial=0))
    piece_rows = np.zeros((nodes, width), dtype=np.int64)
    piece_rows[node, within] = rows
    # a rank's bytes end at (its pieces' bytes) + (its room) x (the node's bytes per row), near
    # enough, since the room is filled from the node's leftovers; so ranks are balanced on each
    # piece's bytes beyond its rows' share of the node's mean
    density = np.bincount(node, weights=weights, minlength=nodes) / np.maximum(
        np.bincount(node, weights=rows, minlength=nodes), 1
    )
    excess = np.zeros((nodes, width))
    excess[node, within] = weights - rows * density[node]
    # largest deviation first (ties in stream order); a heavy piece to the lightest rank with
    # room for its rows, a light one to the heaviest
    order = np.argsort(
        -np.where(np.arange(width) < count[:, None], np.abs(excess), -1.0), axis=1, kind="stable"
    )
    load = np.zeros((nodes, gpus))
    room = np.full((nodes, gpus), per_rank, dtype=np.int64)
    owner = np.full((nodes, width), -1, dtype=np.int64)
    every = np.arange(nodes)
    for p in range(width):
        piece = order[:, p]
        r = piece_rows[every, piece]
        x = excess[every, piece]
        fits = (room >= r[:, None]) & (p < count)[:, None]
        signed = np.where(x[:, None] >= 0, load, -load)
        pick = np.argmin(np.where(fits, signed, np.inf), axis=1)
        took = fits[every, pick]
        n, k = every[took], pick[took]
        owner[n, piece[took]] = k
        load[n, k] += x[took]
        room[n, k] -= r[took]
    local = owner[node, within]
    whole = local >= 0
    left = np.flatnonzero(~whole)
    # what fits nowhere, in stream order, is cut at each rank's remaining room (node-major, so
    # the cuts of node n fall inside node n's leftovers)
    cuts = np.zeros(nodes * gpus + 1, dtype=np.int64)
    np.cumsum(room.reshape(-1), out=cuts[1:])
    parts, part_rank, source = refine(stream.take(left), cuts)
    rank = np.concatenate([node[whole] * gpus + local[whole], part_rank])
    position = np.concatenate([np.flatnonzero(whole), left[source]])
    segments = Spans(
        np.concatenate([stream.shard[whole], parts.shard]),
        np.concatenate([stream.start[whole], parts.start]),
        np.concatenate([stream.end[whole], parts.end]),
    )
    order = np.lexsort((position, rank))
    return segments.take(order), rank[order]
