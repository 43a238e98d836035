"""``ShardLoader``: one loader worker's batches of an epoch, read ahead in background threads.

The worker's rows come from the assignment (stored, given, or planned in memory the same way on
every rank), cut into pieces inside one row group (``reads.py``). Every row-group read of the pass
is listed up front (``schedule.py``); a pool of I/O threads works down the list a fixed depth
ahead, decoding in parallel (pyarrow and the row-group checksum release the GIL), and hints the
kernel to start reading the groups as far again ahead (``readahead.py``), so a cold disk has many
large requests in flight; each group's rows the pass uses are converted to numpy there, once.
A producer thread cuts batches as slices of those arrays, in stream order, for the consumer.
Several datasets interleave by weight, one batch at a time (``mixture.py``).
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from shardfeed.assignment import Assignment, load_assignment
from shardfeed.dataset_source import DatasetSource
from shardfeed.formats.node_cache import NodeCache
from shardfeed.formats.reader import Dataset
from shardfeed.formats.retry import retry_counts
from shardfeed.loader.columns import Batch, decode_images, join_rows, to_batch
from shardfeed.loader.mixture import interleave, normalize
from shardfeed.loader.pins import pinned_shards
from shardfeed.loader.readahead import ReadAhead
from shardfeed.loader.schedule import ReadSchedule, schedule_reads
from shardfeed.loader.streams import Stream, as_world
from shardfeed.planning.assign import PLANNER_VERSION, World
from shardfeed.schemas.units import parse_size

log = logging.getLogger("shardfeed")

STATE_FORMAT = "shardfeed.loader/1"
DEFAULT_IO_THREADS = 4
#: a decoded row group is kept when a piece this close ahead reads it again (at ~4 MiB per
#: group, at most this many groups' worth of memory)
_REUSE_WINDOW = 32
#: row-group reads kept in flight per I/O thread beyond the one being consumed
_READS_PER_THREAD = 2
#: how many reads per I/O thread ahead of its current read a thread hints to the kernel (8
#: interleaved runs of the benchmark's image corpus, cold: 2 -> 49k images/s, 4 -> 54k, 8 -> 56k;
#: again: 4 -> 63k, 8 -> 56k, 16 -> 57k; within the noise, so the shallowest good one)
_HINTS_PER_THREAD = 4
_END = object()

DatasetLike = Dataset | str | os.PathLike
Sources = DatasetLike | Mapping[Any, float] | Sequence[tuple[DatasetLike, float]]


class ShardLoader:
    """Batches (dicts of numpy arrays) for ``worker`` of ``rank`` in ``epoch``.

    ``dataset`` is one dataset (path, URI or :class:`Dataset`), or a mixture: a mapping of
    datasets to weights, or ``(dataset, weight)`` pairs. ``world`` is the number of ranks
    (single-GPU nodes) or a :class:`World`. ``assignment`` is a stored assignment's name or an
    :class:`Assignment` (one dataset only); without it the plan is made in memory with the
    ``pad`` policy, so every rank of an epoch gets the same number of whole batches.
    ``split`` reads only that named split of a ``convert --split`` dataset (one dataset only).
    ``cache_dir``/``cache_bytes`` cache shards read from shared storage on this node.
    See docs/LOADER.md.
    """

    def __init__(
        self,
        dataset: Sources,
        *,
        rank: int,
        world: World | int,
        worker: int = 0,
        num_workers: int = 1,
        epoch: int = 0,
        seed: int = 0,
        batch_size: int,
        columns: Sequence[str] | None = None,
        assignment: Assignment | str | None = None,
        split: str | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_bytes: int | str | None = None,
        prefetch: int = 4,
        decode_images: bool = False,
        io_threads: int = DEFAULT_IO_THREADS,
    ) -> None:
        sources, weights = _sources(dataset)
        if assignment is not None and len(sources) > 1:
            raise ValueError("assignment= applies to one dataset; a mixture plans each in memory")
        if split is not None and len(sources) > 1:
            raise ValueError("split= applies to one dataset, not a mixture")
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
        if prefetch < 1 or io_threads < 1:
            raise ValueError("prefetch and io_threads must be >= 1")
        if (cache_dir is None) != (cache_bytes is None):
            raise ValueError("cache_dir and cache_bytes go together")
        self.world = as_world(world, num_workers)
        self.rank, self.worker, self.seed, self.batch_size = rank, worker, seed, batch_size
        self.prefetch, self.io_threads, self.decode_images = prefetch, io_threads, decode_images
        self.weights = tuple(float(w) for w in normalize(weights))
        self._assignment = assignment
        self.split = split
        self._datasets = [s if isinstance(s, Dataset) else _open(s) for s in sources]
        # close only what this loader opened: a Dataset passed in stays the caller's
        self._owned = [not isinstance(s, Dataset) for s in sources]
        # read once, not at every epoch: the sample sizes and a stored assignment's table
        self._row_bytes = [DatasetSource.of(ds).row_bytes() for ds in self._datasets]
        if isinstance(assignment, str):
            assignment = load_assignment(self._datasets[0], assignment)
        self._assignment = assignment
        self.columns = self._check_columns(columns)
        self.caches: list[NodeCache] = []
        if cache_dir is not None:
            budget = parse_size(cache_bytes) if isinstance(cache_bytes, str) else int(cache_bytes)
            node = rank // self.world.gpus_per_node
            for ds in self._datasets:
                cache = NodeCache(
                    cache_dir, budget, ds.manifest.fingerprint, pinned_shards(ds, node, budget)
                )
                ds.attach_cache(cache)
                self.caches.append(cache)
        self._active: _Pipeline | None = None
        self._metrics = _Metrics()
        self._retries_at_start = retry_counts().get("retries", 0)
        self.set_epoch(epoch)

    # -- the epoch and its schedule ------------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        """Plan ``epoch`` and start it from its first batch."""
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        self._stop()
        self.epoch = epoch
        self.streams = [
            Stream.open(
                ds,
                self.world,
                self.rank,
                self.worker,
                epoch,
                seed=self.seed,
                batch_size=self.batch_size,
                assignment=self._assignment,
                split=self.split,
                row_bytes=row_bytes,
            )
            for ds, row_bytes in zip(self._datasets, self._row_bytes, strict=True)
        ]
        if len(self.streams) == 1:
            n = self.streams[0].plan.num_batches
            self._schedule = np.zeros(n, dtype=np.int64), np.arange(n, dtype=np.int64)
        else:
            source = interleave(self.weights, [s.plan.num_batches for s in self.streams])
            index = np.zeros(len(source), dtype=np.int64)
            for i in range(len(self.streams)):
                mine = source == i
                index[mine] = np.arange(int(mine.sum()))
            self._schedule = source, index
        self.position = 0

    def __len__(self) -> int:
        """Batches in the epoch."""
        return len(self._schedule[0])

    @property
    def samples_seen(self) -> int:
        """Samples this worker delivered in the epoch so far (what elastic resume counts)."""
        source, index = self._schedule
        return sum(
            self.streams[int(s)].plan.batch_rows(int(k))
            for s, k in zip(source[: self.position], index[: self.position], strict=True)
        )

    # -- iteration -----------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Batch]:
        self._stop()
        pipeline = _Pipeline(self, self.position)
        self._active = pipeline
        try:
            while True:
                began = time.perf_counter()
                item = pipeline.out.get()
                self._metrics.waited(time.perf_counter() - began)
                if item is _END:
                    return
                if isinstance(item, BaseException):
                    raise item
                batch, rows, payload = item
                self.position += 1
                self._metrics.delivered(rows, payload)
                yield batch
        finally:
            pipeline.stop()
            if self._active is pipeline:
                self._active = None

    # -- state ---------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Where the epoch stands: load it into a loader made with the same arguments to go on
        with the next batch."""
        return {
            "format": STATE_FORMAT,
            "epoch": self.epoch,
            "batches": self.position,
            "samples": self.samples_seen,
            **self._identity(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state`` (see :meth:`state_dict`); refuses another loader's state."""
        if state.get("format") != STATE_FORMAT:
            raise ValueError(f"not a shardfeed loader state (format {state.get('format')!r})")
        mine = self._identity()
        differ = [k for k in mine if state.get(k) != mine[k]]
        if differ:
            raise ValueError(
                "this state belongs to a loader with other "
                + ", ".join(f"{k} ({state.get(k)!r}, here {mine[k]!r})" for k in differ)
                + "; for a different world, resume the assignment (shardfeed.assignment.resume)"
            )
        batches = state.get("batches")
        self.set_epoch(int(state["epoch"]))
        if not isinstance(batches, int) or not 0 <= batches <= len(self):
            raise ValueError(f"state batches={batches!r} is outside 0..{len(self)}")
        self.position = batches

    def _identity(self) -> dict[str, Any]:
        a = self._assignment
        return {
            "datasets": [ds.manifest.fingerprint for ds in self._datasets],
            "weights": list(self.weights),
            "rank": self.rank,
            "world": [self.world.nodes, self.world.gpus_per_node, self.world.workers],
            "worker": self.worker,
            "seed": self.seed,
            "batch_size": self.batch_size,
            "assignment": a if isinstance(a, str) or a is None else a.name,
            "columns": list(self.columns),
            **({"split": self.split} if self.split is not None else {}),
            # a plan made in memory is only the same plan from the same planner
            **({"planner": PLANNER_VERSION} if a is None else {}),
        }

    # -- metrics -------------------------------------------------------------------------------
    def metrics(self) -> dict[str, float]:
        """Throughput and starvation so far: ``samples_per_s``, ``bytes_per_s`` (payload),
        ``wait_s`` (seconds the consumer waited for a batch: the GPU-starvation signal),
        ``cache_hit_ratio`` (row groups read from this node: node tier or cache), ``io_retries``
        (object-store requests repeated, in this process) and counts."""
        m = self._metrics
        elapsed = max(time.perf_counter() - m.started, 1e-9) if m.started else 0.0
        reads = m.group_reads or 1
        out = {
            "batches": m.batches,
            "samples": m.samples,
            "bytes": m.bytes,
            "seconds": round(elapsed, 6),
            "samples_per_s": m.samples / elapsed if elapsed else 0.0,
            "bytes_per_s": m.bytes / elapsed if elapsed else 0.0,
            "wait_s": round(m.wait, 6),
            "cache_hit_ratio": m.node_reads / reads if m.group_reads else 0.0,
            "row_group_reads": m.group_reads,
            # object-store requests repeated after a transient failure, in this process since
            # the loader was made (formats/retry.py)
            "io_retries": retry_counts().get("retries", 0) - self._retries_at_start,
        }
        if self.caches:
            out["cache_bytes_copied"] = sum(c.counters.bytes_copied for c in self.caches)
            out["cache_evictions"] = sum(c.counters.evicted for c in self.caches)
        return out

    # -- lifetime ------------------------------------------------------------------------------
    def close(self) -> None:
        self._stop()
        for ds, owned in zip(self._datasets, self._owned, strict=True):
            if owned:
                ds.close()

    def __enter__(self) -> ShardLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _stop(self) -> None:
        if self._active is not None:
            self._active.stop()
            self._active = None

    def _check_columns(self, columns: Sequence[str] | None) -> tuple[str, ...]:
        stored = [tuple(f.name for f in ds.features.stored) for ds in self._datasets]
        if columns is None:
            if len(set(stored)) > 1:
                raise ValueError(
                    "the mixture's datasets store different columns; pass columns= with ones "
                    f"they all have: {sorted(set.intersection(*map(set, stored)))}"
                )
            return stored[0]
        for ds, names in zip(self._datasets, stored, strict=True):
            unknown = [c for c in columns if c not in names]
            if unknown:
                raise KeyError(f"{ds.location.display} does not store {unknown}; it has {names}")
        return tuple(columns)


class _Metrics:
    def __init__(self) -> None:
        self.started = 0.0
        self.batches = self.samples = self.bytes = 0
        self.wait = 0.0
        self.group_reads = self.node_reads = 0
        self._lock = threading.Lock()

    def waited(self, seconds: float) -> None:
        if not self.started:
            self.started = time.perf_counter() - seconds
        self.wait += seconds

    def delivered(self, rows: int, payload: int) -> None:
        self.batches += 1
        self.samples += rows
        self.bytes += payload

    def read_group(self, on_node: bool) -> None:
        with self._lock:
            self.group_reads += 1
            self.node_reads += on_node


class _Pipeline:
    """The producer thread and I/O pool behind one pass of iteration."""

    def __init__(self, loader: ShardLoader, start: int) -> None:
        self.loader = loader
        self.out: queue.Queue = queue.Queue(maxsize=loader.prefetch)
        self._stopped = threading.Event()
        self._reads: ReadSchedule | None = None
        self._rows: tuple[np.ndarray, np.ndarray] = (np.zeros(0, np.int64), np.zeros(0, np.int64))
        self._io = ThreadPoolExecutor(loader.io_threads, thread_name_prefix="shardfeed-io")
        self._readahead = ReadAhead()
        self._decode = (
            ThreadPoolExecutor(min(4, os.cpu_count() or 2), thread_name_prefix="shardfeed-decode")
            if loader.decode_images
            else None
        )
        self._thread = threading.Thread(
            target=self._run, args=(start,), name="shardfeed-loader", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        while True:  # unblock a producer waiting on a full queue
            try:
                self.out.get_nowait()
            except queue.Empty:
                break
        self._thread.join()
        self._io.shutdown(wait=True, cancel_futures=True)
        self._readahead.close()
        if self._decode is not None:
            self._decode.shutdown(wait=True, cancel_futures=True)

    def _put(self, item: object) -> bool:
        while not self._stopped.is_set():
            try:
                self.out.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _run(self, start: int) -> None:
        try:
            self._produce(start)
            self._put(_END)
        except BaseException as err:  # handed to the consumer, raised in its thread
            self._put(err)

    def _produce(self, start: int) -> None:
        loader = self.loader
        names = list(loader.columns)
        pieces = _Pieces.of(loader, start)
        schedule = schedule_reads(pieces.stream, pieces.shard, pieces.group, _REUSE_WINDOW)
        self._reads = schedule
        # the rows of its group each read serves: only those are converted to numpy
        first_row = np.full(schedule.num_reads, np.iinfo(np.int64).max, dtype=np.int64)
        end_row = np.zeros(schedule.num_reads, dtype=np.int64)
        np.minimum.at(first_row, schedule.read, pieces.lo)
        np.maximum.at(end_row, schedule.read, pieces.hi)
        self._rows = first_row, end_row
        # reads in flight beyond the one being consumed: enough to keep every I/O thread busy
        # and the disk queue deep, whatever the batch size
        ahead = max(_READS_PER_THREAD * loader.io_threads, 1)
        pending: dict[int, Future] = {}
        submitted = 0
        for i in range(len(pieces.ends) - 1):
            if self._stopped.is_set():
                return
            lo, hi = int(pieces.ends[i]), int(pieces.ends[i + 1])
            # every read the next ``prefetch`` batches start, and at least ``ahead`` reads
            horizon = int(pieces.ends[min(i + 1 + loader.prefetch, len(pieces.ends) - 1)])
            wanted = max(
                int(np.searchsorted(schedule.first, horizon)), int(schedule.read[lo]) + 1 + ahead
            )
            while submitted < min(wanted, schedule.num_reads):
                pending[submitted] = self._io.submit(self._read, submitted, names)
                submitted += 1
            parts = []
            for p in range(lo, hi):
                r = int(schedule.read[p])
                arrays = pending[r].result()
                if schedule.last[r] == p:
                    del pending[r]  # its last piece: the arrays go with the batch
                base = int(self._rows[0][r])
                parts.append((arrays, int(pieces.lo[p]) - base, int(pieces.hi[p]) - base))
            s, k = int(pieces.source[i]), int(pieces.index[i])
            stream = loader.streams[s]
            batch = join_rows(parts, names)
            if self._decode is not None:
                for name in names:
                    feature = stream.dataset.features[name]
                    if feature.dtype == "image":
                        batch[name] = decode_images(batch[name], feature, self._decode)
            if not self._put((batch, stream.plan.batch_rows(k), stream.plan.batch_payload(k))):
                return

    def _hint(self, key: tuple[int, int, int]) -> None:
        source, shard, group = key
        dataset = self.loader.streams[source].dataset
        if dataset.node_cache is not None and not dataset.is_open(shard):
            return  # opening may copy the shard into the node cache: the read does that, not a hint
        try:
            extent = dataset.local_extent(shard, group)
            if extent is not None:
                self._readahead.hint(*extent)
        except Exception as err:  # a hint only: the read reports the problem properly
            log.debug("read-ahead hint for shard %d group %d skipped: %s", shard, group, err)

    def _read(self, r: int, names: list[str]) -> Batch:
        """Decode read ``r``'s row group (in an I/O thread; pyarrow releases the GIL), after
        hinting a later read to the kernel, so the disk is busy meanwhile; its rows the pass
        uses come back as numpy (``to_batch``), so a batch is slices of them, whatever its size."""
        reads = self._reads
        later = r + _HINTS_PER_THREAD * self.loader.io_threads
        if later < reads.num_reads:
            self._hint((int(reads.stream[later]), int(reads.shard[later]), int(reads.group[later])))
        source, shard, group = int(reads.stream[r]), int(reads.shard[r]), int(reads.group[r])
        dataset = self.loader.streams[source].dataset
        table = dataset.read_row_group(shard, group, names)
        self.loader._metrics.read_group(dataset.served_on_node(shard))
        lo, hi = int(self._rows[0][r]), int(self._rows[1][r])
        return to_batch([table.slice(lo, hi - lo)], dataset.features, names)


@dataclass(frozen=True)
class _Pieces:
    """The pieces of a pass from step ``start`` on, in delivery order, across the streams."""

    source: np.ndarray  # per step: its stream and that stream's batch
    index: np.ndarray
    ends: np.ndarray  # len steps + 1: where each step's pieces start, then P
    stream: np.ndarray  # per piece
    shard: np.ndarray
    group: np.ndarray
    lo: np.ndarray
    hi: np.ndarray

    @classmethod
    def of(cls, loader: ShardLoader, start: int) -> _Pieces:
        source, index = (a[start:] for a in loader._schedule)
        plans = [s.plan for s in loader.streams]
        begin = np.empty(len(source), dtype=np.int64)
        count = np.empty(len(source), dtype=np.int64)
        for s, plan in enumerate(plans):
            mine = source == s
            begin[mine] = plan.batch_starts[index[mine]]
            count[mine] = plan.batch_starts[index[mine] + 1] - begin[mine]
        ends = np.zeros(len(source) + 1, dtype=np.int64)
        np.cumsum(count, out=ends[1:])
        stream = np.repeat(source, count)
        position = np.repeat(begin - ends[:-1], count) + np.arange(ends[-1], dtype=np.int64)
        columns = {
            name: np.empty(len(stream), dtype=np.int64) for name in ("shard", "group", "lo", "hi")
        }
        for s, plan in enumerate(plans):
            mine = stream == s
            for name, out in columns.items():
                out[mine] = getattr(plan, name)[position[mine]]
        return cls(source=source, index=index, ends=ends, stream=stream, **columns)


def _sources(dataset: Sources) -> tuple[list[DatasetLike], list[float]]:
    if isinstance(dataset, Mapping):
        items = list(dataset.items())
    elif isinstance(dataset, (Dataset, str, os.PathLike)):
        return [dataset], [1.0]
    else:
        items = [tuple(pair) for pair in dataset]
        if any(len(pair) != 2 for pair in items):
            raise ValueError("a mixture is a mapping or a sequence of (dataset, weight) pairs")
    if not items:
        raise ValueError("a mixture needs at least one dataset")
    return [d for d, _ in items], [w for _, w in items]


def _open(source: DatasetLike) -> Dataset:
    from shardfeed.formats.reader import open_dataset

    return open_dataset(source)
