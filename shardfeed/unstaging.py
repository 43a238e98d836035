"""``shardfeed unstage``: remove what staging put on a tier, and only that.

Shared tiers: the files ``meta/shardfeed/locations.json`` lists for the tier are deleted when
their bytes are still the ones staged (size and sha256); a file that changed since is left
alone and reported. Then locations.json drops the tier, so it stays true. Node tiers: the files
``shardfeed warm`` recorded as created on this node, under the same rule. Empty directories left
behind are removed; nothing else is ever touched.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pyarrow.fs as pafs

from shardfeed.dataset_source import DatasetSource
from shardfeed.formats.atomic import atomic_write_bytes
from shardfeed.formats.reader import Dataset
from shardfeed.formats.tier_copy import Target, exists, file_matches
from shardfeed.schemas.locations import LOCATIONS_PATH, Locations
from shardfeed.schemas.tiers import TierConfig, load_tier_config
from shardfeed.staging import StageError, locations_lock, tier_lock, tier_target
from shardfeed.warming import WARM_RECORD, read_warm_record, write_warm_record

if TYPE_CHECKING:
    from shardfeed.progress import Progress


@dataclass
class UnstageReport:
    tier: str
    root: str
    removed: int = 0
    kept: list[str] = field(default_factory=list)  # changed since staging: not ours to delete

    def to_json(self) -> dict:
        return dict(self.__dict__)


def unstage(
    dataset: Dataset | str | os.PathLike[str],
    tiers: TierConfig | str | os.PathLike[str],
    *,
    only: tuple[str, ...] | None = None,
    filesystems: Mapping[str, pafs.FileSystem] | None = None,
    progress: Progress | None = None,
) -> list[UnstageReport]:
    """Remove staged copies from the tiers of ``only`` (default: every tier in locations.json
    and this node's tier), and keep locations.json true. ``progress`` is told the bytes to
    check first, then hears each file's bytes once it is checked (each is hashed first)."""
    source = DatasetSource.of(dataset)
    config = tiers if isinstance(tiers, TierConfig) else load_tier_config(tiers)
    if not source.location.is_local:
        raise StageError("unstage updates locations.json, so the dataset must be a local directory")
    path = os.path.join(source.location.root, LOCATIONS_PATH)
    locations = _read_locations(path, source)
    names = list(only) if only else [n for n in locations.tiers if n in config.names]
    not_configured = [n for n in names if n not in config.names]
    if not_configured:
        raise StageError(
            f"tier(s) {not_configured} are not in the tier config {list(config.names)}"
        )
    unknown = [n for n in names if n not in locations.tiers]
    if unknown:
        raise StageError(f"tier(s) {unknown} hold nothing staged from this dataset; refusing")
    expected = _expected(source)
    targets = {
        name: tier_target(locations.tiers[name].uri, (filesystems or {}).get(name))
        for name in names
    }
    if progress is not None:  # an estimate: each tier's list is read again under its lock
        progress.add_total(
            sum(
                max(expected.get(rel, (0, ""))[0], 0)
                for name in names
                for rel in _staged_files(locations, name, targets[name])
            )
        )
    reports = []
    changes: list[tuple[str, set[str], bool]] = []  # (tier, files gone, nothing kept)
    for name in names:
        copy = locations.tiers[name]
        target = targets[name]
        report = UnstageReport(name, copy.uri)
        with tier_lock(name, target, "unstage"):
            mine = _staged_files(locations, name, target)
            gone = set()
            for rel in mine:
                size, sha = expected.get(rel, (-1, ""))
                if not exists(target, rel):
                    gone.add(rel)
                elif file_matches(target, rel, size, sha):
                    _delete(target, rel)
                    gone.add(rel)
                    report.removed += 1
                else:
                    report.kept.append(rel)
                if progress is not None:
                    progress(max(size, 0))
            if copy.scope == "node" and target.is_local:
                write_warm_record(target, set(mine) - gone)
                if not report.kept:
                    _delete(target, WARM_RECORD)
        _remove_empty_dirs(target)  # the root too, once the lease file is gone
        changes.append((name, gone, not report.kept))
        reports.append(report)
    # read again under the lock: a stage to another tier may have recorded meanwhile
    with locations_lock(source.location.root, "unstage (recording locations)"):
        locations = _read_locations(path, source)
        for name, gone, emptied in changes:
            for rel in gone:
                held = tuple(n for n in locations.files.get(rel, ()) if n != name)
                if held:
                    locations.files[rel] = held
                else:
                    locations.files.pop(rel, None)
            if emptied:
                locations.tiers.pop(name, None)
        atomic_write_bytes(path, locations.dumps().encode())
    return reports


def _staged_files(locations: Locations, name: str, target: Target) -> list[str]:
    """What staging put on tier ``name``: for a node tier, what warm recorded creating."""
    if locations.tiers[name].scope == "node":
        return sorted(read_warm_record(target)) if target.is_local else []
    return sorted(p for p, held in locations.files.items() if name in held)


def _read_locations(path: str, source: DatasetSource) -> Locations:
    try:
        with open(path, "rb") as handle:
            return Locations.loads(handle.read(), path)
    except FileNotFoundError:
        raise StageError(
            f"{source.location.display} has no {LOCATIONS_PATH}: nothing was staged"
        ) from None


def _expected(source: DatasetSource) -> dict[str, tuple[int, str]]:
    """Size and sha256 of every file staging may have copied: the manifest's records, and the
    manifest and planner files as the source holds them now."""
    manifest = source.manifest
    out = {r.path: (r.bytes, r.sha256) for r in (*manifest.shards, *manifest.files)}
    root = source.location.root
    for directory, _, files in os.walk(os.path.join(root, "meta", "shardfeed")):
        for file in files:
            rel = os.path.relpath(os.path.join(directory, file), root).replace(os.sep, "/")
            if rel not in out:
                with open(os.path.join(directory, file), "rb") as handle:
                    data = handle.read()
                out[rel] = (len(data), hashlib.sha256(data).hexdigest())
    return out


def _delete(target: Target, rel: str) -> None:
    try:
        if target.is_local:
            os.unlink(target.path(rel))
        else:
            target.filesystem.delete_file(target.path(rel))
    except FileNotFoundError:
        pass


def _remove_empty_dirs(target: Target) -> None:
    """Remove directories left empty under the tier copy, deepest first (never a file)."""
    if not target.is_local or not os.path.isdir(target.root):
        return
    for directory, _, _ in sorted(os.walk(target.root), key=lambda w: -w[0].count(os.sep)):
        with contextlib.suppress(OSError):  # fails, harmlessly, unless empty
            os.rmdir(directory)
