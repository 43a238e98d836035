"""Which shards a node's loader cache pins: the hot shards, then those holding hot samples.

The cache holds whole shards, so a hot sample pins its shard. In order, until the budget is
spent: the manifest's hot shards (``convert --hot-weights`` put exactly the hot set there),
then the shards of the hottest samples of the node's cache plan (``shardfeed hot --plan``), or,
without a plan, of the hot index.
"""

from __future__ import annotations

import logging

import numpy as np

from shardfeed.formats.errors import HotIndexMissingError
from shardfeed.formats.reader import Dataset
from shardfeed.schemas.errors import ShardfeedError

log = logging.getLogger("shardfeed")


def pinned_shards(dataset: Dataset, node: int, budget: int) -> list[str]:
    """Shard paths to pin on ``node`` within ``budget`` bytes, in priority order."""
    shards = dataset.shards
    order = list(range(dataset.manifest.hot_shards))
    order += [int(s) for s in _hot_shards(dataset, node) if s >= dataset.manifest.hot_shards]
    pinned, used, seen = [], 0, set()
    for shard in order:
        if shard in seen:
            continue
        seen.add(shard)
        if used + shards[shard].bytes <= budget:
            pinned.append(shards[shard].path)
            used += shards[shard].bytes
    return pinned


def _hot_shards(dataset: Dataset, node: int) -> np.ndarray:
    """Shards in the order their hottest sample ranks (first appearance), for ``node``."""
    from shardfeed.hot import load_cache_plan, load_hot_index

    try:
        plan = load_cache_plan(dataset)
        if node < plan.header.nodes:
            return _first_seen(plan.node_spans(node).shard)
    except HotIndexMissingError:
        pass
    except ShardfeedError as err:
        log.warning("cache plan ignored for pinning: %s", err)
    try:
        return _first_seen(load_hot_index(dataset).shard)  # hottest first
    except HotIndexMissingError:
        return np.zeros(0, dtype=np.int64)
    except ShardfeedError as err:
        log.warning("hot index ignored for pinning: %s", err)
        return np.zeros(0, dtype=np.int64)


def _first_seen(values: np.ndarray) -> np.ndarray:
    _, first = np.unique(values, return_index=True)
    return np.asarray(values)[np.sort(first)].astype(np.int64)
