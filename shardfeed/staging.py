"""``shardfeed stage``: copy a dataset to its shared storage tiers, verified and resumable.

For each shared tier of the policy (``shardfeed/planning/staging.py``): refuse before any copy if
a capacity would be exceeded; take the writer lease of the tier's copy (one writer at a time); delete
temporary files a killed run left; skip files already there whose sha256 matches; copy the rest
in a pool of threads, each file to a temporary name, hashed while copying, fsynced, then renamed
(``formats/tier_copy.py``); copy the manifest last. Then record the verified copies in the
source's ``meta/shardfeed/locations.json``, atomically. See docs/STAGING.md.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import pyarrow.fs as pafs

from shardfeed.dataset_source import DatasetSource
from shardfeed.formats.atomic import TMP_MARKER, atomic_write_bytes, is_temp_name
from shardfeed.formats.reader import Dataset
from shardfeed.formats.retrying_fs import from_uri
from shardfeed.formats.store_path import StorePath
from shardfeed.formats.tier_copy import Target, copy_if_needed, remove_temporaries
from shardfeed.formats.writer_lease import LeaseHeldError, WriterLease
from shardfeed.planning.staging import CopyTask, StagePlan, TierPlan, plan_staging
from shardfeed.schemas.assignment import ASSIGNMENTS_DIR
from shardfeed.schemas.errors import SchemaError, ShardfeedError
from shardfeed.schemas.locations import LOCATIONS_PATH, Locations, TierCopy
from shardfeed.schemas.manifest import MANIFEST_PATH
from shardfeed.schemas.tiers import TierConfig, load_tier_config
from shardfeed.schemas.units import format_size

DEFAULT_WORKERS = 4


class StageError(ShardfeedError):
    pass


class CapacityError(StageError):
    """A tier would be over its declared capacity; nothing was copied."""


class StageLockedError(StageError):
    """Another job (``stage``, ``warm``, ``unstage``) holds the writer lease of the tier's copy."""


@dataclass
class TierResult:
    tier: str
    uri: str
    copied: int = 0
    skipped: int = 0  # already there and verified
    recopied: int = 0  # there, but size or sha256 differed
    removed_temporaries: int = 0
    bytes_copied: int = 0
    seconds: float = 0.0
    striping: str = ""

    def to_json(self) -> dict:
        return dict(self.__dict__)


@dataclass
class StageReport:
    plan: StagePlan
    dry_run: bool
    results: list[TierResult] = field(default_factory=list)
    striping: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict:
        return {
            "dry_run": self.dry_run,
            "plan": [
                {
                    "tier": t.tier,
                    "uri": t.uri,
                    "files": len(t.tasks),
                    "bytes": t.bytes,
                    "capacity": t.capacity,
                    "complete": t.complete,
                    "estimated_seconds": round(t.seconds, 3),
                    "striping": self.striping.get(t.tier, ""),
                }
                for t in self.plan.tiers
            ],
            "notes": list(self.plan.notes),
            "results": [r.to_json() for r in self.results],
        }


def plan(
    dataset: Dataset | str | os.PathLike[str],
    tiers: TierConfig | str | os.PathLike[str],
    *,
    only: tuple[str, ...] | None = None,
) -> tuple[DatasetSource, TierConfig, StagePlan, bytes]:
    """The staging plan for ``dataset``; raises :class:`CapacityError` when a tier would
    overflow (before anything is copied)."""
    source = DatasetSource.of(dataset)
    config = tiers if isinstance(tiers, TierConfig) else load_tier_config(tiers)
    manifest_bytes = source.location.read_bytes(MANIFEST_PATH)
    name = os.path.basename(source.location.root.rstrip("/"))
    staging = plan_staging(
        source.manifest,
        hashlib.sha256(manifest_bytes).hexdigest(),
        len(manifest_bytes),
        config,
        name,
        only,
        _planner_files(source),
    )
    if staging.over_capacity:
        details = "; ".join(
            f"{t.tier} needs {format_size(t.bytes)} of {format_size(t.capacity)}"
            for t in staging.over_capacity
        )
        raise CapacityError(f"refusing to stage: over capacity ({details}); nothing was copied")
    return source, config, staging, manifest_bytes


#: files planners add after publication; each carries its own checks (a header with sha256)
_PLANNER_FILES = (
    "meta/shardfeed/hot_index.parquet",
    "meta/shardfeed/hot_index.json",
    "meta/shardfeed/cache_plan.parquet",
    "meta/shardfeed/cache_plan.json",
)


def _planner_files(source: DatasetSource) -> tuple[CopyTask, ...]:
    """Assignments, hot index and cache plan of a local source, hashed now: the copy is checked
    against these bytes."""
    if not source.location.is_local:
        return ()
    root = source.location.root
    folder = os.path.join(root, ASSIGNMENTS_DIR)
    names = sorted(os.listdir(folder)) if os.path.isdir(folder) else []
    rels = [f"{ASSIGNMENTS_DIR}/{n}" for n in names if not is_temp_name(n)]
    rels += [r for r in _PLANNER_FILES if os.path.isfile(os.path.join(root, r))]
    tasks = []
    for rel in rels:
        data = source.location.read_bytes(rel)
        tasks.append(CopyTask(rel, len(data), hashlib.sha256(data).hexdigest()))
    return tuple(tasks)


def stage(
    dataset: Dataset | str | os.PathLike[str],
    tiers: TierConfig | str | os.PathLike[str],
    *,
    dry_run: bool = False,
    workers: int = DEFAULT_WORKERS,
    only: tuple[str, ...] | None = None,
    filesystems: Mapping[str, pafs.FileSystem] | None = None,
    progress: Callable[[int], None] | None = None,
    beam_args: list[str] | None = None,
    planned: tuple | None = None,
) -> StageReport:
    """Stage ``dataset`` to the shared tiers of ``tiers`` (see the module docstring).

    ``filesystems`` maps a tier name to the pyarrow filesystem its URI lives on (e.g. an
    ``S3FileSystem`` with an endpoint); by default the URI picks one. ``beam_args`` (e.g.
    ``["--runner=dask", ...]``) run the copies as a Beam pipeline instead of a thread pool; the
    lock, the clean-up, the manifest and locations.json stay with this process. ``planned``:
    what :func:`plan` returned for the same arguments, so it is not computed twice."""
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    source, config, staging, _ = planned or plan(dataset, tiers, only=only)
    report = StageReport(staging, dry_run)
    targets = {t.tier: tier_target(t.uri, (filesystems or {}).get(t.tier)) for t in staging.tiers}
    striping = {t.tier: _striping(config, t, targets[t.tier]) for t in staging.tiers}
    report.striping = {name: reason for name, (reason, _) in striping.items()}
    if dry_run:
        return report
    for tier_plan in staging.tiers:
        reason, before_write = striping[tier_plan.tier]
        result = _stage_tier(
            source, tier_plan, targets[tier_plan.tier], before_write, workers, progress, beam_args
        )
        result.striping = reason
        report.results.append(result)
    _record(source, config, staging, report)
    return report


def _stage_tier(
    source: DatasetSource,
    tier_plan: TierPlan,
    target: Target,
    before_write: Callable[[str, int], None] | None,
    workers: int,
    progress: Callable[[int], None] | None,
    beam_args: list[str] | None = None,
) -> TierResult:
    started = time.monotonic()
    result = TierResult(tier_plan.tier, tier_plan.uri)
    with tier_lock(tier_plan.tier, target):
        result.removed_temporaries = len(remove_temporaries(target))
        tasks = [t for t in tier_plan.tasks if t.rel != MANIFEST_PATH]
        last = [t for t in tier_plan.tasks if t.rel == MANIFEST_PATH]

        def one(task) -> tuple[str, int]:
            return copy_if_needed(
                source.location,
                target,
                task.rel,
                task.bytes,
                task.sha256,
                before_write=before_write,
                progress=progress,
            )

        if beam_args is not None:  # the same copies as a Beam pipeline, e.g. across a cluster
            from shardfeed.pipelines.stage_copies import run_copies

            counts = run_copies(source.location, target, tasks, beam_args)
        else:
            with ThreadPoolExecutor(workers, thread_name_prefix="shardfeed-stage") as pool:
                outcomes = list(pool.map(one, tasks))
            counts = {
                k: sum(o == k for o, _ in outcomes) for k in ("copied", "recopied", "skipped")
            }
            counts["bytes"] = sum(n for _, n in outcomes)
        outcome, nbytes = one(last[0]) if last else ("skipped", 0)  # the manifest, last
        counts[outcome] += len(last)
        counts["bytes"] += nbytes
    result.copied, result.recopied, result.skipped = (
        counts["copied"],
        counts["recopied"],
        counts["skipped"],
    )
    result.bytes_copied = counts["bytes"]
    result.seconds = round(time.monotonic() - started, 3)
    return result


def _record(
    source: DatasetSource, config: TierConfig, staging: StagePlan, report: StageReport
) -> None:
    """Merge this run's verified copies into the source's locations.json (local sources only)."""
    if not source.location.is_local:
        return
    path = os.path.join(source.location.root, LOCATIONS_PATH)
    with locations_lock(source.location.root, "stage (recording locations)"):
        _record_locked(source, config, staging, report, path)


#: how long a stage or unstage waits for another job's short hold of the source's lease
LOCATIONS_WAIT_SECONDS = 120.0


@contextlib.contextmanager
def locations_lock(source_root: str, command: str) -> Iterator[None]:
    """Hold the source dataset's writer lease (``formats/writer_lease.py``: correct across
    nodes, on Lustre whatever its flock option) while ``locations.json`` is read, merged and
    replaced, waiting for another stage's or unstage's short hold; first delete the temporary a
    killed run left there: a stray ``.locations.json.tmp-…`` in the source's meta/ fails
    ``verify`` of the source (tests/adversarial/test_crash_injection.py)."""
    path = os.path.join(source_root, LOCATIONS_PATH)
    directory, name = os.path.split(path)
    lease = WriterLease(StorePath(source_root), command, wait=LOCATIONS_WAIT_SECONDS)
    with lease:
        for entry in os.listdir(directory):
            if is_temp_name(entry) and entry.startswith(f".{name}{TMP_MARKER}"):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(directory, entry))
        yield


def _record_locked(
    source: DatasetSource, config: TierConfig, staging: StagePlan, report: StageReport, path: str
) -> None:
    locations = _existing_locations(source, path)
    order = {name: i for i, name in enumerate(config.names)}
    name = os.path.basename(source.location.root.rstrip("/"))
    for tier in config.tiers:  # node tiers: listed so readers probe them; warm fills them
        if tier.is_node and tier.name in (*config.policy.hot, *config.policy.all):
            uri = tier.location(name)
            locations.tiers[tier.name] = TierCopy(uri, tier.scope, False, tier.read_bandwidth)
    for tier_plan in staging.tiers:
        tier = config.tier(tier_plan.tier)
        locations.tiers[tier_plan.tier] = TierCopy(
            tier_plan.uri, tier.scope, tier_plan.complete, tier.read_bandwidth
        )
        for task in tier_plan.tasks:
            held = set(locations.files.get(task.rel, ())) | {tier_plan.tier}
            locations.files[task.rel] = tuple(
                sorted(held, key=lambda n: (order.get(n, 1 << 30), n))
            )
    atomic_write_bytes(path, locations.dumps().encode())


def _existing_locations(source: DatasetSource, path: str) -> Locations:
    fresh = Locations(source.ref())
    try:
        with open(path, "rb") as handle:
            current = Locations.loads(handle.read(), path)
    except FileNotFoundError:
        return fresh
    except SchemaError:
        return fresh  # unreadable: rebuilt from this run's verified copies
    return current if current.dataset == source.ref() else fresh


def tier_target(uri: str, filesystem: pafs.FileSystem | None) -> Target:
    if "://" not in uri:
        return Target(uri)
    if filesystem is None:
        filesystem, root = from_uri(uri)
        return Target(root.rstrip("/"), filesystem)
    return Target(uri.split("://", 1)[1].rstrip("/"), filesystem)


def _striping(config: TierConfig, tier_plan: TierPlan, target: Target):
    """(why striping is or is not applied, the hook that sets it on a temporary file)."""
    tier = config.tier(tier_plan.tier)
    if not target.is_local:
        return "striping skipped: an object store", None
    from shardfeed.formats import lustre

    decision = lustre.plan_striping(target.root, tier.stripe_count, tier.stripe_size)
    if not decision.enabled:
        return decision.reason, None

    def before_write(path: str, size: int) -> None:
        count, stripe_size = lustre.stripe_layout(size, tier.stripe_count, tier.stripe_size)
        lustre.set_stripe(path, count, stripe_size, decision.lfs)

    return decision.reason, before_write


@contextlib.contextmanager
def tier_lock(tier: str, target: Target, command: str = "stage") -> Iterator[None]:
    """The writer lease of the tier's copy (``formats/writer_lease.py``): one ``stage``,
    ``warm`` or ``unstage`` writes it at a time, from any node, on POSIX file systems (Lustre
    whatever its flock option) and object stores alike; a killed holder's lease expires, at
    once when it ran on this machine."""
    root = StorePath(target.root, None if target.is_local else target.filesystem)
    try:
        with WriterLease(root, f"{command} to tier {tier!r}"):
            yield
    except LeaseHeldError as err:
        raise StageLockedError(f"tier {tier!r}: {err}") from None
