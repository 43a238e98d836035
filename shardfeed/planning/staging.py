"""The staging plan: which dataset files go to which shared tier, how many bytes, how long.

A shared tier in the policy's ``all`` list receives every file the manifest lists, then the
manifest itself: a complete dataset that ``shardfeed verify`` accepts on its own. A shared tier
only in ``hot`` receives the hot shards (the manifest's leading ``hot_shards``). Node tiers are
filled per node by ``shardfeed warm``, not here. Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from shardfeed.schemas.manifest import MANIFEST_PATH, Manifest
from shardfeed.schemas.tiers import TierConfig


@dataclass(frozen=True)
class CopyTask:
    """One file to copy: its dataset-relative path, size and expected sha256."""

    rel: str
    bytes: int
    sha256: str


@dataclass(frozen=True)
class TierPlan:
    """What one tier receives. ``complete``: every file and the manifest (copied last)."""

    tier: str
    uri: str
    tasks: tuple[CopyTask, ...]
    capacity: int
    read_bandwidth: int
    complete: bool

    @property
    def bytes(self) -> int:
        return sum(t.bytes for t in self.tasks)

    @property
    def seconds(self) -> float:
        """The estimated copy time at the tier's declared bandwidth (the only figure declared)."""
        return self.bytes / self.read_bandwidth if self.read_bandwidth else float("inf")

    @property
    def fits(self) -> bool:
        return self.bytes <= self.capacity


@dataclass(frozen=True)
class StagePlan:
    tiers: tuple[TierPlan, ...]
    notes: tuple[str, ...] = ()

    @property
    def over_capacity(self) -> tuple[TierPlan, ...]:
        return tuple(t for t in self.tiers if not t.fits)


def plan_staging(
    manifest: Manifest,
    manifest_sha256: str,
    manifest_bytes: int,
    config: TierConfig,
    dataset_name: str,
    only: tuple[str, ...] | None = None,
    extra: tuple[CopyTask, ...] = (),
) -> StagePlan:
    """The copies ``shardfeed stage`` makes: per shared tier of the policy (or of ``only``),
    its files, largest first so the pool stays busy, and the manifest last. ``extra`` are files
    planners added after publication (assignments, hot index, cache plan), which complete tiers
    also receive, so a job that opens a tier copy finds them."""
    notes = []
    wanted = [n for n in dict.fromkeys((*config.policy.all, *config.policy.hot))]
    if only is not None:
        unknown = sorted(set(only) - set(config.names))
        if unknown:
            raise ValueError(f"unknown tier(s) {unknown}; the config has {list(config.names)}")
        wanted = [n for n in wanted if n in only]
    everything = [CopyTask(s.path, s.bytes, s.sha256) for s in manifest.shards]
    everything += [CopyTask(f.path, f.bytes, f.sha256) for f in manifest.files]
    everything += list(extra)
    hot = [CopyTask(s.path, s.bytes, s.sha256) for s in manifest.shards[: manifest.hot_shards]]
    plans = []
    for name in wanted:
        tier = config.tier(name)
        if tier.is_node:
            notes.append(f"{name}: a node tier, filled per node by shardfeed warm")
            continue
        complete = name in config.policy.all
        if not complete and not hot:
            notes.append(f"{name}: receives hot shards only, and the dataset has none")
            continue
        tasks = sorted(everything if complete else hot, key=lambda t: (-t.bytes, t.rel))
        if complete:
            tasks.append(CopyTask(MANIFEST_PATH, manifest_bytes, manifest_sha256))
        plans.append(
            TierPlan(
                name,
                tier.location(dataset_name),
                tuple(tasks),
                tier.capacity,
                tier.read_bandwidth,
                complete,
            )
        )
    return StagePlan(tuple(plans), tuple(notes))
