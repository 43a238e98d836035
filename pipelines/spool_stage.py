"""The spool side of a conversion: scanning a spooling source's rows into bucket-sorted spool
segments, and reading a shard's rows back (``formats/spool.py`` holds the file format)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from shardfeed.formats.sources.base import RowsScan, SourceReader, SpoolingSource, UnitRef
from shardfeed.formats.spool import SPOOL_SUFFIX, SpoolWriter, read_rows, unit_rows
from shardfeed.formats.unit_table import row_locators, spool_starts
from shardfeed.pipelines.graph_config import GraphConfig
from shardfeed.pipelines.spec_stage import piece_name
from shardfeed.planning.shard_plan import buckets_of
from shardfeed.schemas.features import FeatureSpec
from shardfeed.schemas.rejects import RejectRecord
from shardfeed.transforms.hashing import shuffle_keys

SEGMENTS = 1 << 20  # spool segment ids: piece index * SEGMENTS + segment number
#: One file's units as arrays: positions, rows, payload bytes, content hashes, locator texts.
UnitArrays = tuple[np.ndarray, np.ndarray, np.ndarray, list[str], Any]


def spools(source: SourceReader, file: str) -> bool:
    """Whether ``file`` is scanned into a spool: a spooling source's files are, unless it says
    otherwise for this one (``spools(file)``: WebDataset spools only its gzip shards)."""
    if not isinstance(source, SpoolingSource):
        return False
    choose = getattr(source, "spools", None)
    return choose is None or bool(choose(file))


def scan_into_spool(
    file: str, index: int, parts: Iterable[RowsScan], spec: FeatureSpec, config: GraphConfig
) -> tuple[UnitArrays, list[RejectRecord], np.ndarray]:
    """Spool the rows of piece ``index`` of ``file`` (0: the whole file), in segments of about
    ``config.piece_bytes`` decoded bytes; each unit's locator is ``[segment id, its first row
    there]``. With ``config.sort_spools`` a segment's units are written in bucket order, so a
    shard of the (bucket-range) plan takes one run of rows from it; memory holds one segment.
    Returns the units' arrays, the rejects and the units' shuffle keys (``unit_keys``)."""
    held: list[RowsScan] = []
    out: list[tuple] = []  # per segment: positions, rows, payload, hashes, starts, ids, keys
    rejects: list[RejectRecord] = []
    held_bytes = 0

    def flush() -> None:
        segment = index * SEGMENTS + len(out)
        path = config.part("spool", piece_name(file, segment), SPOOL_SUFFIX)
        positions = np.concatenate([p.positions for p in held])
        rows = np.concatenate([p.rows for p in held])
        payload = np.concatenate([p.payload for p in held])
        hashes = [h for p in held for h in p.hashes]
        table = pa.concat_tables([p.table for p in held])
        order = np.arange(len(positions))
        keys, buckets = unit_keys(file, positions, hashes, payload, config)
        if config.sort_spools:
            order = np.argsort(buckets, kind="stable")
            firsts = np.cumsum(rows) - rows
            table = table.take(pa.array(unit_rows(firsts[order], rows[order])))
        with SpoolWriter(path, spec.arrow_schema()) as spool:
            spool.write(table)
        starts = np.empty(len(order), np.int64)
        starts[order] = np.cumsum(rows[order]) - rows[order]
        ids = np.full(len(order), segment, np.int64)
        out.append((positions, rows, payload, hashes, starts, ids, keys))
        held.clear()

    for part in parts:
        rejects.extend(part.rejects)
        if len(part.positions):
            held.append(part)
            held_bytes += part.table.nbytes
        if held_bytes >= config.piece_bytes:
            flush()
            held_bytes = 0
    if held or not out:
        if not held:  # an empty file still gets an (empty) spool
            held.append(
                RowsScan(*(np.zeros(0, np.int64),) * 3, [], spec.arrow_schema().empty_table())
            )
        flush()
    positions, rows, payload = (np.concatenate([o[k] for o in out]) for k in range(3))
    hashes = [h for o in out for h in o[3]]
    starts, ids, keys = (np.concatenate([o[k] for o in out]) for k in (4, 5, 6))
    return (positions, rows, payload, hashes, row_locators(ids, starts)), rejects, keys


def unit_keys(
    file: str, positions: np.ndarray, hashes: list[str], payload: np.ndarray, config: GraphConfig
) -> tuple[np.ndarray, np.ndarray]:
    """Units' shuffle keys and buckets (``shuffle_keys``, ``buckets_of``), for a whole array."""
    keys = shuffle_keys(config.seed, hashes, file, positions)
    return keys, buckets_of(keys, payload, config.options.target_shard_bytes)


def read_units(
    units: pa.Table,
    spooled: np.ndarray,
    refs: Sequence[UnitRef],
    source: SourceReader,
    spec: FeatureSpec,
    config: GraphConfig,
) -> pa.Table:
    """The rows of a shard's units, in order: spooled units from their spools, the others from
    the source (``refs`` are all the units), put back in unit order when both kinds are there."""
    if spooled.all():
        return read_spooled(units, spec, config)
    if not spooled.any():
        return source.read(refs, spec)
    mine = np.flatnonzero(spooled)
    others = np.flatnonzero(~spooled)
    first = read_spooled(units.take(pa.array(mine)), spec, config)
    second = source.read([refs[i] for i in others.tolist()], spec)
    if second.schema != first.schema:
        second = second.select(first.schema.names).cast(first.schema)
    counts = units.column("rows").to_numpy()
    starts = np.cumsum(counts) - counts  # each unit's first row in the shard
    where = np.empty(int(counts.sum()), np.int64)  # shard row -> row of the joined tables
    where[unit_rows(starts[mine], counts[mine])] = np.arange(first.num_rows)
    where[unit_rows(starts[others], counts[others])] = first.num_rows + np.arange(second.num_rows)
    return pa.concat_tables([first, second]).take(pa.array(where))


def read_spooled(units: pa.Table, spec: FeatureSpec, config: GraphConfig) -> pa.Table:
    """The rows of ``units`` (a unit table, in output order) from their pieces' spools: each
    spool is read once, front to back, only the record batches holding the shard's rows."""
    schema = spec.arrow_schema()
    files = pc.dictionary_encode(units.column("file")).combine_chunks()
    names = files.dictionary.to_pylist()
    counts = units.column("rows").to_numpy()
    ids, starts = spool_starts(units)
    codes = files.indices.to_numpy().astype(np.int64)
    width = int(ids.max()) + 1
    spools, which = np.unique(codes * width + ids, return_inverse=True)  # (file, spool id)
    # every row the shard takes, by spool then row: each spool is read front to back, once
    spool_of_row = np.repeat(which, counts)
    local = unit_rows(starts, counts)
    order = np.lexsort((local, spool_of_row))
    bounds = np.searchsorted(spool_of_row[order], np.arange(len(spools) + 1))
    parts = []
    for s, key in enumerate(spools.tolist()):
        path = config.part("spool", piece_name(names[key // width], key % width), SPOOL_SUFFIX)
        parts.append(read_rows(path, local[order[bounds[s] : bounds[s + 1]]], schema))
    taken = pa.concat_tables(parts).combine_chunks()  # the shard's rows only
    inverse = np.empty_like(order)
    inverse[order] = np.arange(len(order), dtype=order.dtype)
    return taken.take(pa.array(inverse))
