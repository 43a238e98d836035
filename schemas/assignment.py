"""The per-rank assignment header ``meta/shardfeed/assignments/NAME.json``.

It describes the span table next to it (``NAME.parquet``): the world it was planned for, the
policy and seed, the dataset it belongs to (fingerprint, samples, shards), per-epoch counts and
the table's own size and sha256. A loader refuses the assignment when the dataset differs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from shardfeed.schemas._strict import (
    JsonDocument,
    count,
    get,
    parse_version,
    require_object,
)
from shardfeed.schemas.errors import SchemaError
from shardfeed.schemas.sidecar import DatasetRef, TableRecord

FORMAT_VERSION = "1.0"
FORMAT_MAJOR = 1
ASSIGNMENTS_DIR = "meta/shardfeed/assignments"
MODES = ("pad", "drop")
#: span table columns, in order; rows sorted by (epoch, rank, worker, seq)
COLUMNS = ("epoch", "rank", "worker", "seq", "shard", "row_start", "row_end")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
INT32_MAX = 2**31 - 1


def check_name(name: str) -> str:
    """An assignment name: letters, digits, ``.``, ``_`` and ``-``, not starting with a dot."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise SchemaError(
            "name",
            f"{name!r} is not a valid assignment name (1-100 of A-Z a-z 0-9 . _ -, "
            "starting with a letter or digit)",
        )
    return name


def header_path(name: str) -> str:
    return f"{ASSIGNMENTS_DIR}/{check_name(name)}.json"


def table_path(name: str) -> str:
    return f"{ASSIGNMENTS_DIR}/{check_name(name)}.parquet"


def _positive(obj: dict[str, Any], key: str, where: str) -> int:
    value = count(obj, key, where)
    if value < 1:
        raise SchemaError(f"{where}.{key}" if where else key, f"must be >= 1, got {value}")
    return value


def _optional_positive(obj: dict[str, Any], key: str, where: str) -> int | None:
    return None if obj.get(key) is None else _positive(obj, key, where)


@dataclass(frozen=True)
class WorldRecord:
    nodes: int
    gpus_per_node: int
    workers: int

    def to_json(self) -> dict[str, Any]:
        return {"nodes": self.nodes, "gpus_per_node": self.gpus_per_node, "workers": self.workers}

    @classmethod
    def from_json(cls, obj: Any, where: str) -> WorldRecord:
        obj = require_object(obj, where)
        world = cls(*(_positive(obj, k, where) for k in ("nodes", "gpus_per_node", "workers")))
        # the span table stores rank and worker as int32
        for key, value in (
            ("nodes", world.nodes * world.gpus_per_node),
            ("workers", world.workers),
        ):
            if value > INT32_MAX:
                what = "ranks (nodes * gpus_per_node)" if key == "nodes" else "workers"
                raise SchemaError(f"{where}.{key}", f"{value} {what} is above {INT32_MAX}")
        return world


@dataclass(frozen=True)
class PolicyRecord:
    mode: str
    batch_size: int | None
    block_rows: int | None

    def to_json(self) -> dict[str, Any]:
        return {"mode": self.mode, "batch_size": self.batch_size, "block_rows": self.block_rows}

    @classmethod
    def from_json(cls, obj: Any, where: str) -> PolicyRecord:
        obj = require_object(obj, where)
        mode = get(obj, "mode", str, where)
        if mode not in MODES:
            raise SchemaError(f"{where}.mode", f"expected one of {MODES}, got {mode!r}")
        return cls(
            mode,
            _optional_positive(obj, "batch_size", where),
            _optional_positive(obj, "block_rows", where),
        )


@dataclass(frozen=True)
class EpochCounts:
    """Per epoch: samples each rank reads, samples left out (drop) or repeated (pad), the
    effective block size in rows and the number of spans."""

    epoch: int
    samples_per_rank: int
    dropped: int
    padded: int
    block_rows: int
    spans: int

    def to_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}

    @classmethod
    def from_json(cls, obj: Any, where: str) -> EpochCounts:
        obj = require_object(obj, where)
        return cls(*(count(obj, k, where) for k in cls.__dataclass_fields__))


@dataclass(frozen=True)
class ResumeRecord:
    """Where a resumed assignment came from: the rest of ``epoch`` of ``name`` after
    ``samples_seen`` samples across its whole world."""

    name: str
    epoch: int
    samples_seen: int
    world: WorldRecord

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "epoch": self.epoch,
            "samples_seen": self.samples_seen,
            "world": self.world.to_json(),
        }

    @classmethod
    def from_json(cls, obj: Any, where: str) -> ResumeRecord:
        obj = require_object(obj, where)
        return cls(
            check_name(get(obj, "name", str, where)),
            count(obj, "epoch", where),
            count(obj, "samples_seen", where),
            WorldRecord.from_json(get(obj, "world", dict, where), f"{where}.world"),
        )


@dataclass(frozen=True)
class AssignmentHeader(JsonDocument):
    """The header of an assignment. ``loads`` raises only :class:`SchemaError` naming the field:
    also for a world or epoch number beyond what the int32 span table and its int64 index hold."""

    name: str
    world: WorldRecord
    seed: int
    policy: PolicyRecord
    dataset: DatasetRef
    epochs: tuple[EpochCounts, ...]
    table: TableRecord
    resumed_from: ResumeRecord | None = None
    format_version: str = FORMAT_VERSION
    #: the named split planned (``assign --split``), None for the whole dataset
    split: str | None = None

    def __post_init__(self) -> None:
        numbers = [e.epoch for e in self.epochs]
        if numbers != sorted(set(numbers)):
            raise SchemaError("epochs", f"epoch numbers must be unique and increasing: {numbers}")
        # the loader indexes spans by (epoch * ranks + rank) * workers + worker in int64
        w = self.world
        if numbers and (numbers[-1] + 1) * w.nodes * w.gpus_per_node * w.workers >= 2**63:
            raise SchemaError(
                f"epochs[{len(numbers) - 1}].epoch",
                f"epoch {numbers[-1]} of a world of {w.nodes * w.gpus_per_node} ranks x "
                f"{w.workers} workers is beyond the int64 span index",
            )
        spans = sum(e.spans for e in self.epochs)
        if spans != self.table.rows:
            raise SchemaError("table.rows", f"{self.table.rows} rows, but epochs list {spans}")

    def counts(self, epoch: int) -> EpochCounts:
        for entry in self.epochs:
            if entry.epoch == epoch:
                return entry
        raise KeyError(
            f"assignment {self.name!r} has no epoch {epoch}; it has {[e.epoch for e in self.epochs]}"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "format_version": self.format_version,
            "name": self.name,
            "world": self.world.to_json(),
            "seed": self.seed,
            "policy": self.policy.to_json(),
            "dataset": self.dataset.to_json(),
            "epochs": [e.to_json() for e in self.epochs],
            "table": self.table.to_json(),
            "resumed_from": None if self.resumed_from is None else self.resumed_from.to_json(),
            **({"split": self.split} if self.split is not None else {}),  # only when set
        }

    @classmethod
    def from_json(cls, obj: Any) -> AssignmentHeader:
        obj = require_object(obj, "")
        version = get(obj, "format_version", str, "")
        parse_version(version, "format_version", FORMAT_MAJOR)
        resumed = obj.get("resumed_from")
        return cls(
            format_version=version,
            name=check_name(get(obj, "name", str, "")),
            world=WorldRecord.from_json(get(obj, "world", dict, ""), "world"),
            seed=count(obj, "seed", ""),
            policy=PolicyRecord.from_json(get(obj, "policy", dict, ""), "policy"),
            dataset=DatasetRef.from_json(get(obj, "dataset", dict, ""), "dataset"),
            epochs=tuple(
                EpochCounts.from_json(e, f"epochs[{i}]")
                for i, e in enumerate(get(obj, "epochs", list, ""))
            ),
            table=TableRecord.from_json(get(obj, "table", dict, ""), "table"),
            resumed_from=None
            if resumed is None
            else ResumeRecord.from_json(resumed, "resumed_from"),
            split=get(obj, "split", str, "", optional=True),
        )
