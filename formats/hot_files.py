"""Read and write the hot index (``meta/shardfeed/hot_index.{parquet,json}``) and the node-cache
plan (``meta/shardfeed/cache_plan.{parquet,json}``); headers are written last."""

from __future__ import annotations

import os

import pyarrow as pa

from shardfeed.formats.atomic import atomic_write_bytes
from shardfeed.formats.checked_table import read_checked_table, write_checked_table
from shardfeed.formats.errors import HotIndexError, HotIndexMissingError
from shardfeed.formats.storage import Location
from shardfeed.schemas.hot import (
    CACHE_HEADER_PATH,
    CACHE_PLAN_PATH,
    HOT_HEADER_PATH,
    HOT_INDEX_PATH,
    CachePlanHeader,
    HotIndexHeader,
)
from shardfeed.schemas.sidecar import TableRecord

HOT_SCHEMA = pa.schema(
    [
        pa.field("index", pa.int64(), nullable=False),  # global sample index
        pa.field("shard", pa.int32(), nullable=False),  # position in the manifest's shards
        pa.field("row", pa.int64(), nullable=False),  # row within the shard
        pa.field("bytes", pa.uint64(), nullable=False),  # payload bytes
        pa.field("expected_accesses_per_epoch", pa.float64(), nullable=False),
    ]
)
CACHE_SCHEMA = pa.schema(
    [
        pa.field("node", pa.int32(), nullable=False),
        pa.field("shard", pa.int32(), nullable=False),
        pa.field("row_start", pa.int64(), nullable=False),
        pa.field("row_end", pa.int64(), nullable=False),
    ]
)


def write_hot_table(root: str, table: pa.Table) -> TableRecord:
    return write_checked_table(root, HOT_INDEX_PATH, table.cast(HOT_SCHEMA))


def write_cache_table(root: str, table: pa.Table) -> TableRecord:
    return write_checked_table(root, CACHE_PLAN_PATH, table.cast(CACHE_SCHEMA), dictionary=["node"])


def write_header(root: str, header: HotIndexHeader | CachePlanHeader) -> None:
    rel = HOT_HEADER_PATH if isinstance(header, HotIndexHeader) else CACHE_HEADER_PATH
    atomic_write_bytes(os.path.join(root, rel), header.dumps().encode())


def read_hot_index(location: Location) -> tuple[HotIndexHeader, pa.Table]:
    header = HotIndexHeader.loads(_read(location, HOT_HEADER_PATH), HOT_HEADER_PATH)
    return header, read_checked_table(
        location, HOT_INDEX_PATH, header.table, HOT_SCHEMA, HotIndexError
    )


def read_cache_plan(location: Location) -> tuple[CachePlanHeader, pa.Table]:
    header = CachePlanHeader.loads(_read(location, CACHE_HEADER_PATH), CACHE_HEADER_PATH)
    return header, read_checked_table(
        location, CACHE_PLAN_PATH, header.table, CACHE_SCHEMA, HotIndexError
    )


def _read(location: Location, rel: str) -> bytes:
    try:
        return location.read_bytes(rel)
    except FileNotFoundError:
        what = "hot index" if rel == HOT_HEADER_PATH else "cache plan"
        raise HotIndexMissingError(
            f"{location.display} has no {what} ({rel}); run shardfeed hot first"
        ) from None
