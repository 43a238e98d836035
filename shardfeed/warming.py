"""``shardfeed warm``: fill one node's local tier (NVMe) before the job, verified and atomic.

Run once per node (``srun --ntasks-per-node=1``). It copies the dataset's hot shards, then the
shards the node's assignment reads (its home shards first, most bytes first) while the node
tier's capacity lasts, from the nearest shared copy, each file through the same temp, hash,
fsync and rename path as ``shardfeed stage``. It records what it created in
``.shardfeed-warm.json`` at the node copy's root, and it never deletes a file it did not create
(only its own temporary files). See docs/STAGING.md.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from shardfeed.dataset_source import DatasetSource
from shardfeed.formats.atomic import atomic_write_bytes
from shardfeed.formats.reader import Dataset
from shardfeed.formats.storage import Location, locate
from shardfeed.formats.tier_copy import Target, copy_file, file_matches, remove_temporaries
from shardfeed.schemas.locations import LOCATIONS_PATH, Locations
from shardfeed.schemas.manifest import MANIFEST_PATH
from shardfeed.schemas.tiers import TierConfig, load_tier_config
from shardfeed.staging import StageError, tier_lock

if TYPE_CHECKING:
    from shardfeed.progress import Progress

WARM_RECORD = ".shardfeed-warm.json"


@dataclass
class WarmReport:
    tier: str
    root: str
    source: str
    node: int
    capacity: int
    planned: list[str] = field(default_factory=list)
    copied: int = 0
    skipped: int = 0  # already there and verified
    left_out: int = 0  # over capacity
    bytes: int = 0  # held on the node tier for this dataset after the run
    seconds: float = 0.0

    def to_json(self) -> dict:
        return dict(self.__dict__)


def warm(
    dataset: Dataset | str | os.PathLike[str],
    tiers: TierConfig | str | os.PathLike[str],
    *,
    node_rank: int,
    nodes: int,
    assignment: str | None = None,
    workers: int = 4,
    dry_run: bool = False,
    progress: Progress | None = None,
) -> WarmReport:
    """Copy node ``node_rank``'s shards to the config's node tier (see the module docstring).

    ``progress`` is told the bytes to copy once they are chosen, then hears every chunk (from
    the copy threads) and every verified copy skipped."""
    from concurrent.futures import ThreadPoolExecutor

    from shardfeed.assignment import load_assignment

    if not 0 <= node_rank < nodes:
        raise ValueError(f"--node-rank {node_rank} is outside 0..{nodes - 1}")
    source = DatasetSource.of(dataset)
    config = tiers if isinstance(tiers, TierConfig) else load_tier_config(tiers)
    tier = config.node_tier
    if tier is None:
        raise StageError("the tier config's policy puts no shard on a node tier; nothing to warm")
    name = os.path.basename(source.location.root.rstrip("/"))
    target = Target(tier.location(name))
    if not target.is_local or "://" in target.root:
        raise StageError(f"node tier {tier.name!r} must be a local path, got {target.root}")
    manifest = source.manifest
    order = list(range(manifest.hot_shards))
    if assignment is not None:
        plan = load_assignment(dataset, assignment)
        if plan.world.nodes != nodes:
            raise ValueError(
                f"assignment {assignment!r} is for {plan.world.nodes} nodes, not {nodes}"
            )
        order += [s for s in _node_shards(plan, node_rank) if s not in set(order)]
    origin = _nearest_copy(source)
    report = WarmReport(tier.name, target.root, origin.display, node_rank, tier.capacity)
    chosen, used = [], 0
    for shard in order:
        record = manifest.shards[shard]
        if used + record.bytes > tier.capacity:
            report.left_out += 1
            continue
        chosen.append(record)
        used += record.bytes
    report.planned = [r.path for r in chosen]
    if dry_run:
        return report
    started = time.monotonic()
    if progress is not None:
        progress.add_total(used)
    with tier_lock(tier.name, target, "warm"):
        remove_temporaries(target)
        created = read_warm_record(target)

        def one(record) -> str:
            if file_matches(target, record.path, record.bytes, record.sha256):
                if progress is not None:
                    progress(record.bytes)
                return "skipped"
            if os.path.lexists(target.path(record.path)) and record.path not in created:
                raise StageError(
                    f"{target.path(record.path)} exists and was not written by shardfeed warm; "
                    "refusing to replace it"
                )
            copy_file(origin, target, record.path, record.bytes, record.sha256, progress=progress)
            return "copied"

        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="shardfeed-warm") as pool:
            outcomes = list(pool.map(one, chosen))
        created |= {r.path for r, o in zip(chosen, outcomes, strict=True) if o == "copied"}
        write_warm_record(target, created)
    report.copied = outcomes.count("copied")
    report.skipped = outcomes.count("skipped")
    report.bytes = used
    report.seconds = round(time.monotonic() - started, 3)
    return report


def _node_shards(plan, node: int) -> list[int]:
    """The shards node ``node`` reads in the assignment's first epoch: home shards first, then
    by bytes read, most first (node home sets are the same every epoch)."""
    epoch = plan.epoch_plan(plan.epochs[0])
    mine = epoch.rank // plan.world.gpus_per_node == node
    shards, bytes_read = epoch.spans.shard[mine], plan.span_bytes(epoch.spans.take(mine))
    totals = np.bincount(shards, weights=bytes_read)
    home = np.bincount(shards, weights=epoch.home[mine].astype(float)) > 0
    read = np.flatnonzero(totals > 0)
    return [int(s) for s in sorted(read.tolist(), key=lambda s: (not home[s], -totals[s], s))]


def _nearest_copy(source: DatasetSource) -> Location:
    """The fastest complete shared copy recorded in locations.json, else the dataset itself."""
    try:
        locations = Locations.loads(source.location.read_bytes(LOCATIONS_PATH))
    except (FileNotFoundError, ValueError):
        return source.location
    if locations.dataset != source.ref():
        return source.location
    shared = [
        (copy.read_bandwidth, name, copy)
        for name, copy in locations.tiers.items()
        if copy.scope == "shared" and copy.complete
    ]
    for _, _, copy in sorted(shared, key=lambda item: (-item[0], item[1])):
        try:
            location = locate(copy.uri)
            location.read_bytes(MANIFEST_PATH)  # reachable, and a finished copy
            return location
        except (OSError, ValueError):
            continue
    return source.location


def read_warm_record(target: Target) -> set[str]:
    try:
        with open(os.path.join(target.root, WARM_RECORD), encoding="utf-8") as handle:
            return set(json.load(handle).get("created", []))
    except (FileNotFoundError, ValueError, AttributeError):
        return set()


def write_warm_record(target: Target, created: set[str]) -> None:
    body = json.dumps({"created": sorted(created)}, indent=1) + "\n"
    atomic_write_bytes(os.path.join(target.root, WARM_RECORD), body.encode())
