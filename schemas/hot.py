"""Headers of the hot-sample index and the node-cache plan.

``meta/shardfeed/hot_index.json`` describes ``hot_index.parquet``: the samples by expected
accesses per epoch, and where that expectation came from. ``meta/shardfeed/cache_plan.json``
describes ``cache_plan.parquet``: the rows each node pins, within its budget. Both record the
dataset they were made for and the sha256 of their table.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
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
HOT_INDEX_PATH = "meta/shardfeed/hot_index.parquet"
HOT_HEADER_PATH = "meta/shardfeed/hot_index.json"
CACHE_PLAN_PATH = "meta/shardfeed/cache_plan.parquet"
CACHE_HEADER_PATH = "meta/shardfeed/cache_plan.json"
SOURCE_KINDS = ("weights-file", "weights-column", "mixture", "access-log")


def _number(obj: dict[str, Any], key: str, where: str) -> float:
    value = get(obj, key, float, where)
    try:
        number = float(value)
    except OverflowError:  # an integer beyond any float: not finite either
        number = math.inf
    if not number >= 0 or math.isinf(number):
        raise SchemaError(
            f"{where}.{key}" if where else key, f"must be finite and >= 0, got {str(value)[:40]}"
        )
    return number


@dataclass(frozen=True)
class HotSource:
    """Where the expected accesses came from: ``kind`` and a human-readable ``detail``
    (file name, column, mixture spec); ``draws_per_epoch`` for weights, ``log_epochs`` for logs."""

    kind: str
    detail: str
    draws_per_epoch: int | None = None
    log_epochs: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "detail": self.detail,
            "draws_per_epoch": self.draws_per_epoch,
            "log_epochs": self.log_epochs,
        }

    @classmethod
    def from_json(cls, obj: Any, where: str) -> HotSource:
        obj = require_object(obj, where)
        kind = get(obj, "kind", str, where)
        if kind not in SOURCE_KINDS:
            raise SchemaError(f"{where}.kind", f"expected one of {SOURCE_KINDS}, got {kind!r}")
        draws = obj.get("draws_per_epoch")
        epochs = obj.get("log_epochs")
        return cls(
            kind,
            get(obj, "detail", str, where),
            None if draws is None else count(obj, "draws_per_epoch", where),
            None if epochs is None else _number(obj, "log_epochs", where),
        )


@dataclass(frozen=True)
class HotIndexHeader(JsonDocument):
    dataset: DatasetRef
    source: HotSource
    samples: int  # samples with expected accesses > 0 (the table's rows)
    expected_accesses: float  # per epoch, over all samples
    accessed_bytes: float  # expected payload bytes read per epoch
    table: TableRecord
    format_version: str = FORMAT_VERSION

    def to_json(self) -> dict[str, Any]:
        return {
            "format_version": self.format_version,
            "dataset": self.dataset.to_json(),
            "source": self.source.to_json(),
            "samples": self.samples,
            "expected_accesses": self.expected_accesses,
            "accessed_bytes": self.accessed_bytes,
            "table": self.table.to_json(),
        }

    @classmethod
    def from_json(cls, obj: Any) -> HotIndexHeader:
        obj = require_object(obj, "")
        version = get(obj, "format_version", str, "")
        parse_version(version, "format_version", FORMAT_MAJOR)
        header = cls(
            dataset=DatasetRef.from_json(get(obj, "dataset", dict, ""), "dataset"),
            source=HotSource.from_json(get(obj, "source", dict, ""), "source"),
            samples=count(obj, "samples", ""),
            expected_accesses=_number(obj, "expected_accesses", ""),
            accessed_bytes=_number(obj, "accessed_bytes", ""),
            table=TableRecord.from_json(get(obj, "table", dict, ""), "table"),
            format_version=version,
        )
        if header.table.rows != header.samples:
            raise SchemaError(
                "table.rows", f"{header.table.rows} rows for {header.samples} samples"
            )
        return header


@dataclass(frozen=True)
class NodePins:
    """What one node pins: samples, bytes, spans, whole shards, and the share of the node's
    expected accessed bytes per epoch they serve (its hit ratio by bytes)."""

    node: int
    samples: int
    bytes: int
    spans: int
    whole_shards: int
    coverage: float

    def to_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_json(cls, obj: Any, where: str) -> NodePins:
        obj = require_object(obj, where)
        ints = {
            k: count(obj, k, where) for k in ("node", "samples", "bytes", "spans", "whole_shards")
        }
        coverage = _number(obj, "coverage", where)
        if coverage > 1 + 1e-9:
            raise SchemaError(f"{where}.coverage", f"must be at most 1, got {coverage}")
        return cls(**ints, coverage=coverage)


@dataclass(frozen=True)
class CachePlanHeader(JsonDocument):
    dataset: DatasetRef
    hot_index_sha256: str
    nodes: int
    node_budget: int  # bytes
    budget_spec: str  # as given, e.g. "10%" or "2TB"
    assignment: str | None
    pins: tuple[NodePins, ...]
    table: TableRecord
    format_version: str = FORMAT_VERSION

    def to_json(self) -> dict[str, Any]:
        return {
            "format_version": self.format_version,
            "dataset": self.dataset.to_json(),
            "hot_index_sha256": self.hot_index_sha256,
            "nodes": self.nodes,
            "node_budget": self.node_budget,
            "budget_spec": self.budget_spec,
            "assignment": self.assignment,
            "pins": [p.to_json() for p in self.pins],
            "table": self.table.to_json(),
        }

    @classmethod
    def from_json(cls, obj: Any) -> CachePlanHeader:
        obj = require_object(obj, "")
        version = get(obj, "format_version", str, "")
        parse_version(version, "format_version", FORMAT_MAJOR)
        nodes = count(obj, "nodes", "")
        pins = tuple(
            NodePins.from_json(p, f"pins[{i}]") for i, p in enumerate(get(obj, "pins", list, ""))
        )
        # compared without building range(nodes): ``nodes`` comes from the file, unbounded
        if len(pins) != nodes or any(p.node != i for i, p in enumerate(pins)):
            raise SchemaError("pins", f"expected one entry per node 0..{nodes - 1}, in order")
        budget = count(obj, "node_budget", "")
        for p in pins:
            if p.bytes > budget:
                raise SchemaError(f"pins[{p.node}].bytes", f"{p.bytes} exceeds the budget {budget}")
        assignment = obj.get("assignment")
        return cls(
            dataset=DatasetRef.from_json(get(obj, "dataset", dict, ""), "dataset"),
            hot_index_sha256=get(obj, "hot_index_sha256", str, ""),
            nodes=nodes,
            node_budget=budget,
            budget_spec=get(obj, "budget_spec", str, ""),
            assignment=None if assignment is None else get(obj, "assignment", str, ""),
            pins=pins,
            table=TableRecord.from_json(get(obj, "table", dict, ""), "table"),
            format_version=version,
        )
