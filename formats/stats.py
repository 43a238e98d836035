"""Per-feature statistics in LeRobot's ``stats.json`` shape: min max mean std count and quantiles.

``FeatureStats`` is mergeable: mean and variance merge exactly (Chan et al.), quantiles come from a
deterministic compacting sketch that is exact up to ``sketch_size`` values per element and has rank
error of about ``1 / sketch_size`` per compaction level beyond. Merging in a fixed order (shard order)
gives byte-identical results however the work was split.
"""

from __future__ import annotations

import base64
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

QUANTILES: dict[str, float] = {"q01": 0.01, "q10": 0.10, "q50": 0.50, "q90": 0.90, "q99": 0.99}
STAT_KEYS = ("min", "max", "mean", "std", "count", *QUANTILES)
DEFAULT_SKETCH_SIZE = 2048
SKETCH_VALUES_BUDGET = 1 << 22  # float64 values per sketch level: 32 MiB, whatever the tensor width


def _pack(values: np.ndarray) -> str:
    """A float64 array as base64 text (``to_state``)."""
    return base64.b64encode(np.ascontiguousarray(values, dtype="<f8").tobytes()).decode("ascii")


def _unpack(packed: str | list) -> np.ndarray:
    """``_pack``'s text (or a plain list of numbers) back as a float64 array."""
    if isinstance(packed, str):
        return np.frombuffer(base64.b64decode(packed), dtype="<f8").astype(np.float64)
    return np.asarray(packed, dtype=np.float64)


def sketch_size_for(width: int) -> int:
    """Values kept per element and level: 2048 for small features, fewer for wide tensors."""
    return int(min(DEFAULT_SKETCH_SIZE, max(64, SKETCH_VALUES_BUDGET // max(1, width))))


@dataclass
class FeatureStats:
    """Running stats over rows of shape ``shape``; every element is tracked separately."""

    shape: tuple[int, ...]
    integer: bool = False
    sketch_size: int = 0  # 0 picks sketch_size_for(width)
    count: int = 0
    # frames summarised when a row is not a frame (image stats add one row per pixel): the
    # reported ``count``, as LeRobot counts sampled frames; None for numeric stats (count = rows)
    frames: int | None = None
    _mean: np.ndarray | None = None
    _m2: np.ndarray | None = None
    _min: np.ndarray | None = None
    _max: np.ndarray | None = None
    _levels: list[np.ndarray] = field(default_factory=list)
    _parity: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.sketch_size <= 0:
            self.sketch_size = sketch_size_for(self.width)

    @property
    def width(self) -> int:
        return int(np.prod(self.shape))

    def add(self, values: np.ndarray) -> FeatureStats:
        """Add a batch: ``values`` has shape ``(n, *shape)`` (or ``(n,)`` for scalars)."""
        flat = np.asarray(values).reshape(len(values), self.width)
        if len(flat) == 0:
            return self
        data = flat.astype(np.float64)
        batch = FeatureStats(self.shape, self.integer, self.sketch_size)
        batch.count = len(flat)
        with np.errstate(
            invalid="ignore", over="ignore"
        ):  # NaN/inf inputs give NaN stats, by design
            batch._mean = data.mean(axis=0)
            batch._m2 = ((data - batch._mean) ** 2).sum(axis=0)
        batch._min = flat.min(axis=0)
        batch._max = flat.max(axis=0)
        batch._levels = [data]
        batch._parity = [0]
        batch._compact()
        return self.merge(batch)

    def merge(self, other: FeatureStats) -> FeatureStats:
        """Fold ``other`` into self (in place) and return self."""
        if other.frames is not None:
            self.frames = (self.frames or 0) + other.frames
        if other.count == 0:
            return self
        if self.count == 0:
            self.count, self._mean, self._m2 = other.count, other._mean.copy(), other._m2.copy()
            self._min, self._max = other._min.copy(), other._max.copy()
            self._levels = [lvl.copy() for lvl in other._levels]
            self._parity = list(other._parity)
            return self
        n_a, n_b = self.count, other.count
        n = n_a + n_b
        with np.errstate(invalid="ignore", over="ignore"):
            delta = other._mean - self._mean
            self._mean = self._mean + delta * (n_b / n)
            self._m2 = self._m2 + other._m2 + delta**2 * (n_a * n_b / n)
        self._min = np.minimum(self._min, other._min)
        self._max = np.maximum(self._max, other._max)
        self.count = n
        for h, level in enumerate(other._levels):
            if h < len(self._levels):
                self._levels[h] = np.concatenate([self._levels[h], level])
            else:
                self._levels.append(level.copy())
                self._parity.append(0)
        self._compact()
        return self

    def _compact(self) -> None:
        h = 0
        while h < len(self._levels):
            level = self._levels[h]
            if len(level) > self.sketch_size:
                ordered = np.sort(level, axis=0)
                keep = ordered[-1:] if len(ordered) % 2 else ordered[:0]
                pairs = ordered[: len(ordered) - len(keep)]
                promoted = pairs[self._parity[h] :: 2]
                self._parity[h] ^= (
                    1  # alternate which half survives, so errors do not drift one way
                )
                self._levels[h] = keep
                if h + 1 == len(self._levels):
                    self._levels.append(promoted)
                    self._parity.append(0)
                else:
                    self._levels[h + 1] = np.concatenate([self._levels[h + 1], promoted])
            h += 1

    def to_state(self) -> dict[str, Any]:
        """A JSON-able snapshot that ``from_state`` restores exactly (floats round-trip in JSON)."""
        arrays = None
        if self.count:
            arrays = {
                "mean": self._mean.tolist(),
                "m2": self._m2.tolist(),
                "min": self._min.tolist(),
                "max": self._max.tolist(),
                "dtype": str(self._min.dtype),
                # base64 of little-endian float64: a sketch holds thousands of values per level,
                # and a list of Python floats cost about 1 ms per feature and shard to build
                "levels": [_pack(lvl) for lvl in self._levels],
                "parity": list(self._parity),
            }
        return {
            "shape": list(self.shape),
            "integer": self.integer,
            "sketch_size": self.sketch_size,
            "count": self.count,
            "arrays": arrays,
            **({} if self.frames is None else {"frames": self.frames}),
        }

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> FeatureStats:
        stats = cls(tuple(state["shape"]), bool(state["integer"]), int(state["sketch_size"]))
        stats.count = int(state["count"])
        if state.get("frames") is not None:
            stats.frames = int(state["frames"])
        arrays = state["arrays"]
        if arrays:
            width = stats.width
            stats._mean = np.asarray(arrays["mean"], dtype=np.float64)
            stats._m2 = np.asarray(arrays["m2"], dtype=np.float64)
            stats._min = np.asarray(arrays["min"], dtype=arrays["dtype"])
            stats._max = np.asarray(arrays["max"], dtype=arrays["dtype"])
            stats._levels = [_unpack(lvl).reshape(-1, width) for lvl in arrays["levels"]]
            stats._parity = [int(p) for p in arrays["parity"]]
        return stats

    def quantile(self, q: float) -> np.ndarray:
        """The smallest value whose weighted rank reaches ``q`` (the inverted-CDF definition)."""
        return self.quantiles([q])[0]

    def quantiles(self, qs: Sequence[float]) -> list[np.ndarray]:
        """:meth:`quantile` of each of ``qs``, sorting the sketch once."""
        values = np.concatenate(self._levels)
        weights = np.concatenate([np.full(len(lvl), 2.0**h) for h, lvl in enumerate(self._levels)])
        order = np.argsort(values, axis=0, kind="stable")
        sorted_values = np.take_along_axis(values, order, axis=0)
        cum = np.cumsum(weights[order], axis=0)
        columns = np.arange(values.shape[1])
        out = []
        for q in qs:
            target = q * cum[-1]
            pos = (cum < target[None, :] - 1e-9).sum(axis=0)
            pos = np.minimum(pos, len(values) - 1)
            out.append(sorted_values[pos, columns])
        return out

    def to_json(self) -> dict[str, Any]:
        """LeRobot layout: every statistic is a nested list of the feature's shape; count is [n]."""
        if self.count == 0:
            raise ValueError("no values were added")

        def shaped(arr: np.ndarray) -> Any:
            arr = np.asarray(arr).reshape(self.shape)
            values = arr.tolist()
            # the walk over the nested lists only where a value needs it (NaN/inf inputs)
            return values if np.isfinite(arr).all() else _finite_or_none(values)

        # integers keep their own dtype (tolist gives exact Python ints, uint64 included)
        cast = (
            (lambda a: a.astype(np.int64) if a.dtype == np.bool_ else a)
            if self.integer
            else (lambda a: a.astype(np.float64))
        )
        with np.errstate(invalid="ignore"):
            std = np.sqrt(self._m2 / self.count)
        out: dict[str, Any] = {
            "min": shaped(cast(self._min)),
            "max": shaped(cast(self._max)),
            "mean": shaped(self._mean),
            "std": shaped(std),
            "count": [self.count if self.frames is None else self.frames],
        }
        for key, value in zip(QUANTILES, self.quantiles(list(QUANTILES.values())), strict=True):
            out[key] = shaped(value)
        return out

    def summary(self) -> StatsSummary:
        """The finished values, without the sketch (what an episode's row needs)."""
        return StatsSummary(self.shape, self.count, self.to_json() if self.count else None)


@dataclass(frozen=True)
class StatsSummary:
    """A finished :class:`FeatureStats`: its ``to_json`` values, count and shape, no longer
    mergeable. About 50 numbers per element where a state holds the sketch's thousands, so a shard
    writer hands each episode's stats to the driver this way, worked out in parallel, instead of
    the driver working out every episode's quantiles alone (``ShardOutcome.to_state``)."""

    shape: tuple[int, ...]
    count: int
    values: dict[str, Any] | None  # None when count is 0

    def to_json(self) -> dict[str, Any]:
        if self.values is None:
            raise ValueError("no values were added")
        return self.values

    def summary(self) -> StatsSummary:
        return self

    def to_state(self) -> dict[str, Any]:
        return {"summary": {"shape": list(self.shape), "count": self.count, "values": self.values}}


def stats_from_state(state: Mapping[str, Any]) -> FeatureStats | StatsSummary:
    """A :meth:`StatsSummary.to_state` or :meth:`FeatureStats.to_state` read back."""
    if "summary" not in state:
        return FeatureStats.from_state(state)
    summary = state["summary"]
    return StatsSummary(tuple(summary["shape"]), int(summary["count"]), summary["values"])


def segment_stats(
    values: np.ndarray, edges: Sequence[int], shape: tuple[int, ...], integer: bool
) -> list[tuple[FeatureStats, StatsSummary]]:
    """For each range ``[a, b)`` of consecutive ``edges`` (from 0 to ``len(values)``): the stats
    ``FeatureStats(shape, integer).add(values[a:b])`` gives and their :meth:`~FeatureStats.summary`,
    equal value for value.

    A LeRobot shard holds hundreds of episodes, each summarised per feature, and a sketch with its
    summary cost about 0.3 ms per episode and feature. Here minima and maxima are one ``reduceat`` per
    feature; a range that a sketch holds whole (all but the longest episodes) takes its mean and
    spread (in numpy's own summation order) and one sort for its quantiles; the finished values
    become lists once per statistic."""
    width = int(np.prod(shape))
    bounds = list(itertools.pairwise(int(e) for e in edges))
    out: list[tuple[FeatureStats, StatsSummary] | None] = [None] * len(bounds)
    # ranges a sketch keeps whole; the others (and empty ones) are summarised as FeatureStats does
    fast = [i for i, (a, b) in enumerate(bounds) if 0 < b - a <= sketch_size_for(width)]
    for i in sorted(set(range(len(bounds))) - set(fast)):
        a, b = bounds[i]
        stats = FeatureStats(shape, integer).add(values[a:b])
        out[i] = stats, stats.summary()
    if not fast:
        return out  # type: ignore[return-value]  # every slot is filled
    flat = np.asarray(values).reshape(len(values), width)
    data = flat.astype(np.float64)
    starts = np.asarray([a for a, b in bounds if b > a], dtype=np.int64)  # non-empty ranges
    rows = np.searchsorted(starts, [bounds[i][0] for i in fast])  # each fast range's among them
    mins = np.minimum.reduceat(flat, starts, axis=0)[rows]
    maxs = np.maximum.reduceat(flat, starts, axis=0)[rows]
    lengths = np.asarray([bounds[i][1] - bounds[i][0] for i in fast], dtype=np.float64)
    picks, sketches = [], []
    for row, (i, at) in enumerate(zip(fast, _exact_ranks(lengths).tolist(), strict=True)):
        a, b = bounds[i]
        part = data[a:b]
        with np.errstate(invalid="ignore", over="ignore"):  # NaN/inf inputs: as FeatureStats
            mean = np.add.reduce(part, axis=0) / (b - a)  # what mean(axis=0) computes
            m2 = np.add.reduce((part - mean) ** 2, axis=0)
        sketch = FeatureStats(shape, integer, count=b - a, _mean=mean, _m2=m2)
        sketch._min, sketch._max, sketch._levels, sketch._parity = mins[row], maxs[row], [part], [0]
        sketches.append(sketch)
        picks.append(np.sort(part, axis=0, kind="stable")[at])
    if integer:  # as FeatureStats.to_json casts minima and maxima
        mins, maxs = (a.astype(np.int64) if a.dtype == np.bool_ else a for a in (mins, maxs))
    else:
        mins, maxs = mins.astype(np.float64), maxs.astype(np.float64)
    with np.errstate(invalid="ignore"):
        stds = np.sqrt(np.stack([s._m2 for s in sketches]) / lengths[:, None])
    quantiles = np.stack(picks)  # (fast ranges, len(QUANTILES), width)
    lists = [
        (key, _shaped_rows(stat, shape))
        for key, stat in (
            ("min", mins),
            ("max", maxs),
            ("mean", np.stack([s._mean for s in sketches])),
            ("std", stds),
        )
    ]
    q_lists = [_shaped_rows(quantiles[:, n], shape) for n in range(len(QUANTILES))]
    for row, (i, sketch) in enumerate(zip(fast, sketches, strict=True)):
        values_ = {key: per_range[row] for key, per_range in lists}
        values_["count"] = [sketch.count]
        values_.update(zip(QUANTILES, (q[row] for q in q_lists), strict=True))
        out[i] = sketch, StatsSummary(shape, sketch.count, values_)
    return out  # type: ignore[return-value]  # every slot is filled


def _exact_ranks(lengths: np.ndarray) -> np.ndarray:
    """Per count ``n`` of ``lengths``, the sorted positions :meth:`FeatureStats.quantiles` picks
    for :data:`QUANTILES` when every value weighs 1 (position k reaches rank k + 1): the count
    of ranks ``1..n`` below ``q * n - 1e-9``, its comparison, at most ``n - 1``."""
    below = np.asarray(list(QUANTILES.values()))[None, :] * lengths[:, None] - 1e-9
    ranks = np.maximum(0.0, np.ceil(below) - 1)
    return np.minimum(ranks, lengths[:, None] - 1).astype(np.int64)


def _shaped_rows(stacked: np.ndarray, shape: tuple[int, ...]) -> list[Any]:
    """Per row of ``stacked`` (rows, width): its values as nested lists of ``shape``, NaN and
    infinities as None (as :meth:`FeatureStats.to_json`)."""
    rows = stacked.reshape(len(stacked), *shape)
    lists = rows.tolist()
    finite = np.isfinite(stacked).reshape(len(stacked), -1).all(axis=1)
    if not finite.all():
        lists = [
            v if ok else _finite_or_none(v) for v, ok in zip(lists, finite.tolist(), strict=True)
        ]
    return lists


def merge_all(parts: list[Mapping[str, FeatureStats]]) -> dict[str, FeatureStats]:
    """Merge per-part stats dicts in the given order (the order fixes the bytes)."""
    merged: dict[str, FeatureStats] = {}
    for part in parts:
        for name, stats in part.items():
            if name not in merged:
                merged[name] = FeatureStats(stats.shape, stats.integer, stats.sketch_size)
            merged[name].merge(stats)
    return merged


def _finite_or_none(value: Any) -> Any:
    """Replace NaN and infinities (from NaN/inf inputs) with None: JSON has no token for them."""
    if isinstance(value, list):
        return [_finite_or_none(v) for v in value]
    if isinstance(value, float) and not np.isfinite(value):
        return None
    return value
