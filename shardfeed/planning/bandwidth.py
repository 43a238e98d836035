"""Bandwidth planner: what a training world reads per second, which tier serves it, and whether
the declared tiers keep up. Pure: dataclasses in, a :class:`BandwidthPlan` out, no I/O.

Units: bytes and bytes per second throughout; GB = 10^9 and MB = 10^6 where a docstring or
message says GB or MB. Bytes per sample are *on-disk* (compressed) bytes, ``sum(shard.bytes) /
num_samples``, because compressed bytes are what cross the network; decoded payload is larger.

The formulas (``docs/PLANNING.md`` has the reasoning):

- demand: ``per_gpu = R x S``, ``per_node = gpus_per_node x per_gpu``, ``aggregate = gpus x
  per_gpu`` for ``R`` samples per GPU per second of ``S`` bytes each;
- node tier: it serves ``share = coverage(budget)`` of the bytes, ``share x per_node`` per node,
  checked against the node tier's declared per-node read bandwidth;
- shared tier: ``aggregate x (1 - share)``, checked against its declared aggregate bandwidth;
- headroom = declared / needed per tier that carries load; the plan's headroom is the smallest;
  verdict ``ok`` at >= :data:`OK_HEADROOM` (1.2), ``tight`` at >= :data:`TIGHT_HEADROOM` (1.0),
  ``short`` below, ``unknown`` when a tier that carries load has no declared bandwidth;
- loader workers per rank ``max(1, ceil(per_gpu / worker_bytes_per_s))``;
- prefetch depth ``max(2, ceil(latency_s x R / batch_size) + 1)`` batches per rank;
- minimum shards ``nodes x max(4, gpus_per_node x workers_per_rank)``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from shardfeed.schemas.errors import ShardfeedError
from shardfeed.schemas.units import format_decimal_size as _size

__all__ = [
    "DEFAULT_BATCH_SIZE",
    "DEFAULT_LATENCY_S",
    "DEFAULT_WORKER_BYTES_PER_S",
    "MIN_PREFETCH_DEPTH",
    "MIN_SHARDS_PER_NODE",
    "MIN_SHARD_BYTES",
    "OK_HEADROOM",
    "TIGHT_HEADROOM",
    "BandwidthPlan",
    "BandwidthPlanError",
    "Coverage",
    "LoaderModel",
    "NodeCache",
    "SharedTier",
    "Workload",
    "plan_bandwidth",
    "uniform_coverage",
]

GB = 10**9
MB = 10**6
#: headroom (declared / needed) at or above which the verdict is "ok": 20% spare absorbs
#: stragglers, other jobs on a shared file system and epoch-boundary bursts
OK_HEADROOM = 1.2
#: headroom at or above which the verdict is "tight" (enough on paper, nothing spare)
TIGHT_HEADROOM = 1.0
DEFAULT_WORKER_BYTES_PER_S = 100 * MB  # one loader worker: read + decode, 100 MB/s
DEFAULT_LATENCY_S = 0.010  # 10 ms first-byte latency of the shared tier (Lustre: a few ms)
DEFAULT_BATCH_SIZE = 32  # samples per rank per step
MIN_PREFETCH_DEPTH = 2  # one batch being consumed, one arriving
#: docs/ASSIGNMENT.md: node affinity holds (>= 90% of a node's bytes from its home set) with at
#: least 4 shards per node
MIN_SHARDS_PER_NODE = 4
#: smallest shard worth advising: two 4 MiB row groups; below that, per-file costs (open,
#: footer, metadata-server round trip) dominate a shard's read time
MIN_SHARD_BYTES = 8 * 2**20  # 8 MiB

#: ``coverage(budget_bytes) -> share``: the share (0..1) of expected read bytes per epoch a node
#: cache of ``budget_bytes`` serves when it pins the hottest samples (``shardfeed.hot``)
Coverage = Callable[[int], float]


class BandwidthPlanError(ShardfeedError, ValueError):
    """Planner inputs out of range (a message naming the input)."""


def uniform_coverage(dataset_bytes: int) -> Coverage:
    """Coverage when every sample is equally likely to be read: a cache of ``b`` bytes serves
    ``min(1, b / dataset_bytes)`` of the reads."""

    def coverage(budget_bytes: int) -> float:
        return 1.0 if dataset_bytes <= 0 else min(1.0, budget_bytes / dataset_bytes)

    return coverage


def _positive(value: float, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise BandwidthPlanError(f"{name} must be > 0, got {value!r}")
    if not math.isfinite(value):
        raise BandwidthPlanError(f"{name} must be finite, got {value!r}")


def _non_negative_int(value: int, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise BandwidthPlanError(f"{name} must be an integer >= 0, got {value!r}")


@dataclass(frozen=True)
class Workload:
    """The world and the data: ``gpus`` ranks, ``gpus_per_node`` per node, each consuming
    ``samples_per_gpu_per_s`` samples of ``bytes_per_sample`` on-disk bytes; the dataset has
    ``dataset_bytes`` on disk in ``num_shards`` shards, of which ``hot_set_bytes`` are the
    leading hot shards (0: no hot set)."""

    gpus: int
    gpus_per_node: int
    samples_per_gpu_per_s: float
    bytes_per_sample: float
    dataset_bytes: int
    num_shards: int
    hot_set_bytes: int = 0

    def __post_init__(self) -> None:
        for name in ("gpus", "gpus_per_node"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise BandwidthPlanError(f"{name} must be an integer >= 1, got {value!r}")
        if self.gpus % self.gpus_per_node:
            raise BandwidthPlanError(
                f"gpus ({self.gpus}) must be a multiple of gpus_per_node ({self.gpus_per_node})"
            )
        _positive(self.samples_per_gpu_per_s, "samples_per_gpu_per_s")
        _positive(self.bytes_per_sample, "bytes_per_sample")
        for name in ("dataset_bytes", "num_shards", "hot_set_bytes"):
            _non_negative_int(getattr(self, name), name)

    @property
    def nodes(self) -> int:
        return self.gpus // self.gpus_per_node


@dataclass(frozen=True)
class NodeCache:
    """The node tier: each node pins ``budget_bytes`` of the hottest samples; ``coverage`` maps
    a budget to the share of reads it serves (needed when ``budget_bytes > 0``).
    ``read_bandwidth`` (bytes/s per node) and ``capacity`` (bytes per node) are the tier's
    declared values, None when no tier is declared."""

    budget_bytes: int = 0
    coverage: Coverage | None = None
    read_bandwidth: float | None = None
    capacity: int | None = None
    name: str | None = None

    def __post_init__(self) -> None:
        _non_negative_int(self.budget_bytes, "hot budget")
        if self.budget_bytes > 0 and self.coverage is None:
            raise BandwidthPlanError("a hot budget > 0 needs a coverage function")
        if self.read_bandwidth is not None:
            _positive(self.read_bandwidth, "node tier read_bandwidth")
        if self.capacity is not None:
            _non_negative_int(self.capacity, "node tier capacity")


@dataclass(frozen=True)
class SharedTier:
    """The shared tier that serves what node caches miss, with its declared aggregate read
    bandwidth in bytes/s."""

    name: str
    read_bandwidth: float

    def __post_init__(self) -> None:
        _positive(self.read_bandwidth, f"{self.name} read_bandwidth")


@dataclass(frozen=True)
class LoaderModel:
    """Loader assumptions: ``worker_bytes_per_s`` one loader worker sustains (read + decode),
    ``latency_s`` shared-tier first-byte latency, ``batch_size`` samples per rank per step."""

    worker_bytes_per_s: float = DEFAULT_WORKER_BYTES_PER_S
    latency_s: float = DEFAULT_LATENCY_S
    batch_size: int = DEFAULT_BATCH_SIZE

    def __post_init__(self) -> None:
        _positive(self.worker_bytes_per_s, "worker_bytes_per_s")
        if isinstance(self.latency_s, bool) or not (
            isinstance(self.latency_s, (int, float)) and 0 <= self.latency_s < math.inf
        ):
            raise BandwidthPlanError(f"latency_s must be >= 0 and finite, got {self.latency_s!r}")
        if isinstance(self.batch_size, bool) or not isinstance(self.batch_size, int):
            raise BandwidthPlanError(f"batch_size must be an integer, got {self.batch_size!r}")
        if self.batch_size < 1:
            raise BandwidthPlanError(f"batch_size must be >= 1, got {self.batch_size}")


@dataclass(frozen=True)
class BandwidthPlan:
    """The planner's answer. Rates are bytes/s; ``node_*`` rates are per node; headrooms are
    declared / needed, None when the tier carries no load or declares no bandwidth."""

    nodes: int
    per_gpu_bytes_per_s: float
    per_node_bytes_per_s: float
    aggregate_bytes_per_s: float
    node_tier: str | None
    hot_budget_bytes: int
    node_share: float
    node_served_bytes_per_s: float
    node_declared_bytes_per_s: float | None
    node_headroom: float | None
    shared_tier: str | None
    shared_needed_bytes_per_s: float
    shared_declared_bytes_per_s: float | None
    shared_headroom: float | None
    headroom: float | None
    verdict: str
    limiting_tier: str | None
    workers_per_rank: int
    loader_workers_per_node: int
    prefetch_depth: int
    prefetch_factor: int
    min_shards_per_node: int
    min_shards: int
    num_shards: int
    shards_ok: bool
    max_shard_bytes: int | None
    notes: tuple[str, ...] = field(default=())

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["notes"] = list(self.notes)
        out["thresholds"] = {"ok": OK_HEADROOM, "tight": TIGHT_HEADROOM}
        return out


def _verdict(headroom: float) -> str:
    if headroom >= OK_HEADROOM:
        return "ok"
    return "tight" if headroom >= TIGHT_HEADROOM else "short"


def plan_bandwidth(
    workload: Workload,
    cache: NodeCache | None = None,
    shared: SharedTier | None = None,
    loader: LoaderModel | None = None,
) -> BandwidthPlan:
    """Plan the read bandwidth of ``workload`` over a node cache and a shared tier."""
    cache = cache or NodeCache()
    loader = loader or LoaderModel()
    w = workload
    notes: list[str] = []

    # demand
    per_gpu = float(w.samples_per_gpu_per_s * w.bytes_per_sample)
    per_node = w.gpus_per_node * per_gpu
    aggregate = w.gpus * per_gpu

    # node tier: the share a per-node cache of the hottest samples serves
    share = 0.0
    if cache.budget_bytes > 0 and cache.coverage is not None:
        share = cache.coverage(cache.budget_bytes)
        if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 <= share <= 1:
            raise BandwidthPlanError(
                f"coverage({cache.budget_bytes}) returned {share!r}; expected a share in 0..1"
            )
        share = float(share)
    node_served = share * per_node
    node_headroom = None
    if node_served > 0 and cache.read_bandwidth is not None:
        node_headroom = cache.read_bandwidth / node_served
    if cache.capacity is not None and cache.budget_bytes > cache.capacity:
        notes.append(
            f"the hot budget ({_size(cache.budget_bytes)}) exceeds the node tier's "
            f"capacity ({_size(cache.capacity)})"
        )
    if 0 < cache.budget_bytes < w.hot_set_bytes:
        notes.append(
            f"the dataset's hot shards ({_size(w.hot_set_bytes)}) do not fit the hot "
            f"budget ({_size(cache.budget_bytes)}); only part of the hot set is cached"
        )

    # shared tier: everything the node cache misses
    shared_needed = aggregate * (1.0 - share)
    shared_headroom = None
    if shared_needed > 0 and shared is not None:
        shared_headroom = shared.read_bandwidth / shared_needed

    # verdict over the tiers that carry load
    loaded: list[tuple[str, float | None]] = []
    if node_served > 0:
        loaded.append((cache.name or "node cache", node_headroom))
    if shared_needed > 0:
        loaded.append((shared.name if shared else "shared tier", shared_headroom))
    undeclared = [name for name, h in loaded if h is None]
    declared = [(h, name) for name, h in loaded if h is not None]
    headroom: float | None = None
    limiting: str | None = None
    if undeclared:
        verdict = "unknown"
        notes.append(
            f"no declared read bandwidth for {', '.join(undeclared)}; "
            "declare the tiers (--tiers) to get a verdict"
        )
    elif declared:
        headroom, limiting = min(declared)
        verdict = _verdict(headroom)
    else:  # a demand that rounds to 0 bytes/s
        verdict = "ok"

    # loader
    workers = max(1, math.ceil(per_gpu / loader.worker_bytes_per_s))
    depth = max(
        MIN_PREFETCH_DEPTH,
        math.ceil(loader.latency_s * w.samples_per_gpu_per_s / loader.batch_size) + 1,
    )

    # shards: affinity (>= 4 per node) and one shard per loader worker of the node
    per_node_shards = max(MIN_SHARDS_PER_NODE, w.gpus_per_node * workers)
    min_shards = w.nodes * per_node_shards
    max_shard_bytes = w.dataset_bytes // min_shards if w.dataset_bytes >= min_shards else None
    shards_ok = w.num_shards >= min_shards
    if not shards_ok:
        if max_shard_bytes is not None and max_shard_bytes >= MIN_SHARD_BYTES:
            advice = f"convert again with shards of at most {_size(max_shard_bytes)} on disk"
        else:
            advice = (
                f"the dataset ({_size(w.dataset_bytes)} on disk) is too small to cut into "
                "that many shards of at least 8 MiB, so nodes will share shards (less node "
                "affinity, fewer parallel reads)"
            )
        notes.append(
            f"the dataset has {w.num_shards:,} shards, fewer than the {min_shards:,} this "
            f"world needs ({per_node_shards} per node); {advice}"
        )

    return BandwidthPlan(
        nodes=w.nodes,
        per_gpu_bytes_per_s=per_gpu,
        per_node_bytes_per_s=per_node,
        aggregate_bytes_per_s=aggregate,
        node_tier=cache.name,
        hot_budget_bytes=cache.budget_bytes,
        node_share=share,
        node_served_bytes_per_s=node_served,
        node_declared_bytes_per_s=cache.read_bandwidth,
        node_headroom=node_headroom,
        shared_tier=shared.name if shared else None,
        shared_needed_bytes_per_s=shared_needed,
        shared_declared_bytes_per_s=shared.read_bandwidth if shared else None,
        shared_headroom=shared_headroom,
        headroom=headroom,
        verdict=verdict,
        limiting_tier=limiting,
        workers_per_rank=workers,
        loader_workers_per_node=w.gpus_per_node * workers,
        prefetch_depth=depth,
        prefetch_factor=math.ceil(depth / workers),
        min_shards_per_node=per_node_shards,
        min_shards=min_shards,
        num_shards=w.num_shards,
        shards_ok=shards_ok,
        max_shard_bytes=max_shard_bytes,
        notes=tuple(notes),
    )
