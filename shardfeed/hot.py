"""The hot-sample index and the node-cache plan of a dataset (no Beam import).

``build_hot_index`` turns per-sample weights or an access log into expected accesses per epoch,
ranks the samples by them (``shardfeed/planning/hot.py``) and ``save()`` writes
``meta/shardfeed/hot_index.{parquet,json}``. ``plan_cache`` decides what each node pins within
its budget and writes ``meta/shardfeed/cache_plan.{parquet,json}``. See docs/HOT.md.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from shardfeed.dataset_source import DatasetSource
from shardfeed.formats import hot_files
from shardfeed.formats.errors import HotIndexError, HotIndexMissingError
from shardfeed.formats.reader import Dataset
from shardfeed.formats.store_path import StorePath
from shardfeed.formats.writer_lease import WriterLease
from shardfeed.hot_inputs import HotInputError, read_access_log, read_weights
from shardfeed.planning.hot import (
    accesses_from_log,
    accesses_from_weights,
    coverage_curve,
    fill,
    heat_order,
    node_pins,
)
from shardfeed.planning.spans import Spans, from_global, merge_adjacent
from shardfeed.schemas.hot import (
    CACHE_HEADER_PATH,
    CACHE_PLAN_PATH,
    HOT_HEADER_PATH,
    HOT_INDEX_PATH,
    CachePlanHeader,
    HotIndexHeader,
    HotSource,
    NodePins,
)
from shardfeed.schemas.sidecar import TableRecord
from shardfeed.schemas.units import parse_size_or_share

__all__ = [
    "CachePlan",
    "HotIndex",
    "HotIndexError",
    "HotIndexMissingError",
    "build_hot_index",
    "load_cache_plan",
    "load_hot_index",
    "plan_cache",
]

_UNSAVED = TableRecord("", 0, 0, "0" * 64)


@dataclass
class HotIndex:
    """Samples with expected accesses > 0, hottest first: global ``index``, ``shard``, ``row``,
    payload ``bytes`` and ``accesses`` (expected per epoch)."""

    header: HotIndexHeader
    index: np.ndarray
    shard: np.ndarray
    row: np.ndarray
    bytes: np.ndarray
    accesses: np.ndarray
    source: DatasetSource

    def coverage(self, budget_bytes: int) -> float:
        """Share of the expected accessed bytes per epoch that a cache of ``budget_bytes``
        serves when it pins the hottest samples (first fit in heat order)."""
        total = float((self.accesses * self.bytes).sum())
        if total <= 0:
            return 0.0
        pinned = fill(np.arange(len(self.index)), self.bytes, int(budget_bytes))
        return float((self.accesses[pinned] * self.bytes[pinned]).sum()) / total

    def curve(
        self, fractions: tuple[float, ...] = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)
    ) -> list[dict]:
        """The coverage curve at cache sizes given as fractions of the dataset's payload: the
        share of expected accessed bytes and of expected accesses served."""
        dataset_bytes = sum(s.payload_bytes for s in self.source.manifest.shards)
        cum_bytes, bytes_share = coverage_curve(
            self.accesses, self.bytes, np.arange(len(self.index))
        )
        counts = np.concatenate([[0.0], np.cumsum(self.accesses)])
        total_accesses = counts[-1] or 1.0
        out = []
        for fraction in fractions:
            budget = fraction * dataset_bytes
            k = int(np.searchsorted(cum_bytes, budget, side="right")) - 1  # prefix that fits
            out.append(
                {
                    "fraction_of_dataset": fraction,
                    "cache_bytes": int(budget),
                    "bytes_share": round(float(bytes_share[k]), 6),
                    "accesses_share": round(float(counts[k] / total_accesses), 6),
                }
            )
        return out

    def bytes_for_share(self, share: float) -> int:
        """The smallest cache (bytes) whose hottest samples serve ``share`` of accessed bytes."""
        cum_bytes, bytes_share = coverage_curve(
            self.accesses, self.bytes, np.arange(len(self.index))
        )
        k = min(int(np.searchsorted(bytes_share, share - 1e-12, side="left")), len(cum_bytes) - 1)
        return int(cum_bytes[k])

    def save(self) -> HotIndex:
        """Write the table, then the header, into the dataset (a local directory or an object-store
        prefix; the header is the commit point), holding the dataset's writer lease."""
        table = pa.table(
            {
                "index": self.index,
                "shard": self.shard,
                "row": self.row,
                "bytes": self.bytes.astype(np.uint64),
                "expected_accesses_per_epoch": self.accesses,
            }
        )
        store = StorePath.at(self.source.location)
        with WriterLease(store, "hot"), store.writing() as (root, written):
            record = hot_files.write_hot_table(root, table)
            self.header = _replace(self.header, table=record)
            hot_files.write_header(root, self.header)
            written += [HOT_INDEX_PATH, HOT_HEADER_PATH]
        return self


@dataclass
class CachePlan:
    """Per node, the row spans it pins (``node``, ``spans``), and the header's per-node totals."""

    header: CachePlanHeader
    node: np.ndarray
    spans: Spans
    source: DatasetSource

    def node_spans(self, node: int) -> Spans:
        return self.spans.take(self.node == node)

    def save(self) -> CachePlan:
        """Write the table, then the header, into the dataset (as :meth:`HotIndex.save`)."""
        table = pa.table(
            {
                "node": self.node,
                "shard": self.spans.shard,
                "row_start": self.spans.start,
                "row_end": self.spans.end,
            }
        )
        store = StorePath.at(self.source.location)
        with WriterLease(store, "hot"), store.writing() as (root, written):
            record = hot_files.write_cache_table(root, table)
            self.header = _replace(self.header, table=record)
            hot_files.write_header(root, self.header)
            written += [CACHE_PLAN_PATH, CACHE_HEADER_PATH]
        return self


def build_hot_index(
    dataset: Dataset | str | os.PathLike[str],
    *,
    weights: str | None = None,
    access_log: str | None = None,
    source_column: str = "source",
    draws_per_epoch: int | None = None,
    log_epochs: float = 1.0,
) -> HotIndex:
    """Expected accesses per epoch from ``weights`` (``column:NAME``, a mixture
    ``src=w,src=w``, or a file of ``index,weight``) or from ``access_log`` (a file of accessed
    global indices), ranked hottest first. Exactly one of the two is given."""
    if (weights is None) == (access_log is None):
        raise ValueError("give exactly one of weights and access_log")
    source = DatasetSource.of(dataset)
    sizes = np.diff(source.row_bytes().prefix)
    n = source.manifest.num_samples
    if weights is not None:
        values, kind, detail = read_weights(source, weights, source_column)
        try:
            accesses = accesses_from_weights(values, draws_per_epoch)
        except ValueError as err:
            raise HotInputError(f"--weights {weights}: {err}") from None
        origin = HotSource(kind, detail, draws_per_epoch=draws_per_epoch or n)
    else:
        ids, detail = read_access_log(access_log)
        try:
            accesses = accesses_from_log(ids, n, log_epochs)
        except ValueError as err:
            raise HotInputError(f"--access-log {access_log}: {err}") from None
        origin = HotSource("access-log", detail, log_epochs=float(log_epochs))
    order = heat_order(accesses, sizes)
    order = order[accesses[order] > 0]
    offsets = np.array([s.index_start for s in source.manifest.shards], dtype=np.int64)
    shard = np.searchsorted(offsets, order, side="right") - 1
    header = HotIndexHeader(
        dataset=source.ref(),
        source=origin,
        samples=len(order),
        expected_accesses=float(accesses.sum()),
        accessed_bytes=float((accesses * sizes).sum()),
        table=TableRecord(_UNSAVED.path, len(order), 0, _UNSAVED.sha256),
    )
    return HotIndex(
        header,
        order.astype(np.int64),
        shard.astype(np.int32),
        (order - offsets[shard]).astype(np.int64),
        sizes[order].astype(np.int64),
        accesses[order],
        source,
    )


def load_hot_index(dataset: Dataset | str | os.PathLike[str]) -> HotIndex:
    """The dataset's hot index; refuses one made for another dataset or modified since."""
    source = DatasetSource.of(dataset)
    header, table = hot_files.read_hot_index(source.location)
    _check_dataset(header.dataset, source, "hot index")
    c = {name: table.column(name).to_numpy() for name in table.column_names}
    return HotIndex(
        header,
        c["index"],
        c["shard"],
        c["row"],
        c["bytes"].astype(np.int64),
        c["expected_accesses_per_epoch"],
        source,
    )


def plan_cache(
    hot: HotIndex,
    node_budget: str | int = "10%",
    *,
    assignment=None,
    nodes: int | None = None,
) -> CachePlan:
    """What each node pins within ``node_budget``. With an ``assignment`` (epoch 0 decides
    which node reads which sample; node homes are the same every epoch) each node pins the
    hottest samples it reads; without one every node may read anything and all ``nodes`` pin
    the same global hot set."""
    source = hot.source
    manifest = source.manifest
    dataset_bytes = sum(s.payload_bytes for s in manifest.shards)
    budget = parse_size_or_share(node_budget, dataset_bytes)
    offsets = np.array([s.index_start for s in manifest.shards] + [manifest.num_samples])
    n = manifest.num_samples
    accesses = np.zeros(n)
    accesses[hot.index] = hot.accesses
    sizes = np.zeros(n, dtype=np.int64)
    sizes[hot.index] = hot.bytes
    owner = None
    if assignment is not None:
        world = assignment.world
        nodes = world.nodes
        plan = assignment.epoch_plan(assignment.epochs[0])
        a, b = plan.spans.to_global(offsets)
        owner = np.full(n, -1, dtype=np.int64)
        lengths = b - a
        rows = np.repeat(a - np.cumsum(lengths) + lengths, lengths) + np.arange(lengths.sum())
        owner[rows] = np.repeat(plan.rank // world.gpus_per_node, lengths)
    nodes = nodes or 1
    pins = node_pins(accesses, sizes, budget, owner, nodes)
    node_col, span_parts, records = [], [], []
    whole = np.diff(offsets)
    for node, pinned in enumerate(pins):
        ids = np.sort(pinned)
        spans = from_global(ids, ids + 1, offsets)
        spans, _ = merge_adjacent(spans, np.zeros(len(spans), dtype=np.int64))
        mine = accesses * sizes if owner is None else accesses * sizes * (owner == node)
        served = float(mine[pinned].sum()) / max(float(mine.sum()), 1e-300)
        full = np.bincount(spans.shard, weights=spans.rows, minlength=len(whole)) == whole
        records.append(
            NodePins(
                node,
                len(pinned),
                int(sizes[pinned].sum()),
                len(spans),
                int((full & (whole > 0)).sum()),
                round(min(served, 1.0), 6),
            )
        )
        node_col.append(np.full(len(spans), node, dtype=np.int32))
        span_parts.append(spans)
    header = CachePlanHeader(
        dataset=source.ref(),
        hot_index_sha256=hot.header.table.sha256,
        nodes=nodes,
        node_budget=budget,
        budget_spec=str(node_budget),
        assignment=None if assignment is None else assignment.name,
        pins=tuple(records),
        table=_UNSAVED,
    )
    spans = Spans(
        np.concatenate([s.shard for s in span_parts]),
        np.concatenate([s.start for s in span_parts]),
        np.concatenate([s.end for s in span_parts]),
    )
    return CachePlan(header, np.concatenate(node_col), spans, source)


def load_cache_plan(dataset: Dataset | str | os.PathLike[str]) -> CachePlan:
    source = DatasetSource.of(dataset)
    header, table = hot_files.read_cache_plan(source.location)
    _check_dataset(header.dataset, source, "cache plan")
    c = {name: table.column(name).to_numpy() for name in table.column_names}
    return CachePlan(header, c["node"], Spans(c["shard"], c["row_start"], c["row_end"]), source)


def _check_dataset(ref, source: DatasetSource, what: str) -> None:
    if ref != source.ref():
        raise HotIndexError(
            f"the {what} was made for dataset {ref.fingerprint}, not this one "
            f"({source.ref().fingerprint}); run shardfeed hot again"
        )


def _replace(header, **changes):
    values = {k: getattr(header, k) for k in header.__dataclass_fields__}
    return type(header)(**{**values, **changes})
