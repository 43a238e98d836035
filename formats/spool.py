"""The scan's spool: each input file's good rows, decoded once, kept for the shard writers.

A source that decodes its rows while scanning (``SpoolingSource``) hands them to the pipeline,
which appends them here, one uncompressed Arrow IPC file per input file in the work directory.
Shard writers then take their rows by index from a memory map, so a ``.jsonl.gz`` is inflated
once, however many shards its rows go to, and no input is parsed twice. Uncompressed, because a
shard takes a few rows from every part of every spool file: compressed batches would be inflated
once per shard, which is the cost the spool exists to remove. The price is disk: the work
directory holds the decoded rows until the dataset is published.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from types import TracebackType

import numpy as np
import pyarrow as pa

SPOOL_SUFFIX = ".arrow"
_BATCH_ROWS = 64 * 1024  # rows per record batch: takes touch a few batches' buffers at a time


class SpoolWriter:
    """Appends tables to a spool file; the file appears under its name only when complete."""

    def __init__(self, path: str, schema: pa.Schema) -> None:
        self.path, self.rows = path, 0
        self._temp = f"{path}.tmp-{os.getpid()}"
        os.makedirs(os.path.dirname(path), exist_ok=True)
        self._sink = pa.OSFile(self._temp, "wb")
        self._writer = pa.ipc.new_file(self._sink, schema)

    def write(self, table: pa.Table) -> None:
        if table.num_rows:
            self._writer.write_table(table, max_chunksize=_BATCH_ROWS)
            self.rows += table.num_rows

    def __enter__(self) -> SpoolWriter:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self._writer.close()
        self._sink.close()
        if kind is None:
            os.replace(self._temp, self.path)  # scratch: a re-run rescans, so no fsync
        else:
            os.unlink(self._temp)


def open_spool(stack: contextlib.ExitStack, path: str, schema: pa.Schema) -> pa.Table:
    """A spool file's rows, memory-mapped (no copy); the map stays open until ``stack`` closes,
    so take what is needed from the table before then."""
    source = stack.enter_context(pa.memory_map(path))
    table = pa.ipc.open_file(source).read_all()
    if table.schema != schema:
        raise ValueError(f"{path}: spool schema {table.schema} is not {schema}")
    return table


def unit_rows(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The row numbers of units with these first rows and row counts, in unit order."""
    starts = np.asarray(starts, np.int64)
    counts = np.asarray(counts, np.int64)
    if len(counts) and counts.min() == counts.max() == 1:
        return starts
    firsts = np.cumsum(counts) - counts  # where each unit begins in the output
    return np.repeat(starts - firsts, counts) + np.arange(int(counts.sum()), dtype=np.int64)


def take_in_order(tables: Sequence[pa.Table], rows: np.ndarray, schema: pa.Schema) -> pa.Table:
    """Rows ``rows`` of ``tables`` joined end to end, in the given order.

    Taken record batch by record batch, in row order (one pass over the memory-mapped spools, a
    page read once), then put in the asked order in memory. A take over the joined chunked table
    instead copies every chunk into one array first for string columns (Arrow 25): the whole
    spool once per shard, which made the write time grow with the shard count.
    """
    batches = [batch for table in tables for batch in table.to_batches()]
    sizes = np.array([b.num_rows for b in batches], np.int64)
    firsts = np.cumsum(sizes) - sizes
    order = np.argsort(rows, kind="stable")
    wanted = np.asarray(rows, np.int64)[order]
    which = np.searchsorted(firsts, wanted, side="right") - 1
    cuts = np.flatnonzero(np.diff(which)) + 1
    pieces = [
        batches[int(part[0])].take(pa.array(local))
        for part, local in zip(
            np.split(which, cuts), np.split(wanted - firsts[which], cuts), strict=True
        )
        if len(part)
    ]
    taken = pa.Table.from_batches(pieces, schema).combine_chunks()  # the shard's rows only
    inverse = np.empty_like(order)
    inverse[order] = np.arange(len(order), dtype=order.dtype)
    return taken.take(pa.array(inverse))
