"""The scan's spool: each input file's good rows, decoded once, kept for the shard writers.

A source that decodes its rows while scanning (``SpoolingSource``) hands them to the pipeline,
which appends them here, one uncompressed Arrow IPC file per input file (or piece of one) in the
work directory. Shard writers then read their rows back by index, so a ``.jsonl.gz`` is inflated
once, however many shards its rows go to, and no input is parsed twice. Uncompressed, because a
shard takes a few rows from every part of every spool file: compressed batches would be inflated
once per shard, which is the cost the spool exists to remove. The price is disk: the work
directory holds the decoded rows until the dataset is published.

Record batches hold about ``_BATCH_BYTES`` (256 KiB) each, and a reader holds one at a time (read with
``pread``, not memory-mapped: mapped pages a shard touched stayed in the process's resident set
until the map closed, so a writer's memory grew with the spool). Each spool has a small ``.rows``
file beside it, its batches' row counts, so a reader knows which batches hold its rows without
reading the others.
"""

from __future__ import annotations

import contextlib
import os
from types import TracebackType

import numpy as np
import pyarrow as pa

from shardfeed.formats.store_path import StorePath

SPOOL_SUFFIX = ".arrow"
ROWS_SUFFIX = ".rows"  # beside a spool: its record batches' row counts (int64, little-endian)
_BATCH_BYTES = 256 << 10  # about this much data per record batch: a shard reads whole batches
_BATCH_ROWS = 64 * 1024  # and at most this many rows


class SpoolWriter:
    """Appends tables to a spool file; the file appears under its name only when complete (on
    an object store it is built in this process's temporary directory, then uploaded)."""

    def __init__(self, path: StorePath, schema: pa.Schema) -> None:
        self.path, self.rows = path, 0
        self._stage = contextlib.ExitStack()
        self._local = self._stage.enter_context(path.staged())
        self._temp = f"{self._local}.tmp-{os.getpid()}"
        self._sink = pa.OSFile(self._temp, "wb")
        self._writer = pa.ipc.new_file(self._sink, schema)
        self._sizes: list[int] = []

    def write(self, table: pa.Table) -> None:
        if not table.num_rows:
            return
        per_row = max(1, table.nbytes // table.num_rows)
        chunk = int(min(_BATCH_ROWS, max(1, _BATCH_BYTES // per_row)))
        for batch in table.to_batches(max_chunksize=chunk):
            if batch.num_rows:
                self._writer.write_batch(batch)
                self._sizes.append(batch.num_rows)
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
        if kind is None:  # scratch: a re-run rescans, so no fsync; the row counts go first
            sizes = np.asarray(self._sizes, dtype="<i8").tobytes()
            rows_path(self.path).write_bytes(sizes)
            os.replace(self._temp, self._local)
        else:
            os.unlink(self._temp)
        self._stage.__exit__(kind, error, trace)  # uploads a complete spool, nothing otherwise


def rows_path(path: StorePath) -> StorePath:
    """The row-count file beside spool ``path``."""
    return path.parent / (path.name + ROWS_SUFFIX)


def read_rows(path: StorePath, rows: np.ndarray, schema: pa.Schema) -> pa.Table:
    """Rows ``rows`` (ascending, repeats allowed) of a spool file, in that order, reading only
    the record batches that hold them, one at a time. A run of consecutive rows (a shard's rows
    of a bucket-sorted spool) is sliced from its batches, with no copy and no per-batch index."""
    sizes = np.frombuffer(rows_path(path).read_bytes(), dtype="<i8")
    ends = np.cumsum(sizes)
    rows = np.asarray(rows, np.int64)
    if not len(rows):
        return schema.empty_table()
    first, last = int(rows[0]), int(rows[-1])
    total = int(ends[-1]) if len(ends) else 0
    if first < 0 or last >= total:
        raise ValueError(f"{path}: rows {first}..{last} outside its {total} rows")
    with path.open_input() as source:
        reader = pa.ipc.open_file(source)
        if reader.schema != schema:
            raise ValueError(f"{path}: spool schema {reader.schema} is not {schema}")
        if _is_run(rows):  # slices of the batches it spans
            return _read_run(reader, ends, first, last + 1, schema)
        which = np.searchsorted(ends, rows, side="right")
        cuts = np.flatnonzero(np.diff(which)) + 1
        pieces = []
        for part in np.split(np.arange(len(rows)), cuts):
            number = int(which[part[0]])
            batch = reader.get_batch(number)  # read into memory, dropped after the take
            local = rows[part] - (int(ends[number]) - int(sizes[number]))
            if _is_run(local):
                pieces.append(batch.slice(int(local[0]), len(local)))  # no copy
            else:
                pieces.append(batch.take(pa.array(local)))
    return pa.Table.from_batches(pieces, schema)


def _is_run(values: np.ndarray) -> bool:
    """Whether ascending ``values`` are consecutive integers (no repeats, no gaps)."""
    return int(values[-1]) - int(values[0]) + 1 == len(values) and bool(
        (np.diff(values) == 1).all()
    )


def _read_run(
    reader: pa.ipc.RecordBatchFileReader, ends: np.ndarray, start: int, stop: int, schema: pa.Schema
) -> pa.Table:
    """Rows ``start:stop`` of a spool whose batches end at rows ``ends``."""
    number = int(np.searchsorted(ends, start, side="right"))
    last = int(np.searchsorted(ends, stop - 1, side="right"))
    pieces = []
    for b in range(number, last + 1):
        batch = reader.get_batch(b)
        batch_start = int(ends[b]) - batch.num_rows
        lo = max(start, batch_start) - batch_start
        hi = min(stop, int(ends[b])) - batch_start
        pieces.append(batch if lo == 0 and hi == batch.num_rows else batch.slice(lo, hi - lo))
    return pa.Table.from_batches(pieces, schema)


def unit_rows(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The row numbers of units with these first rows and row counts, in unit order."""
    starts = np.asarray(starts, np.int64)
    counts = np.asarray(counts, np.int64)
    if len(counts) and counts.min() == counts.max() == 1:
        return starts
    firsts = np.cumsum(counts) - counts  # where each unit begins in the output
    return np.repeat(starts - firsts, counts) + np.arange(int(counts.sum()), dtype=np.int64)
