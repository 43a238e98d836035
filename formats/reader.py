"""The fast reader: SoA numpy batches straight from whole row groups, located in O(log n).

``open_dataset`` refuses anything without a valid manifest, and every shard is checked against its
record (path safety, size, rows, row groups, schema; Parquet page CRCs on read) before a byte of it
is returned. Full sha256 checks are ``Dataset.verify()``.

A staged dataset (``meta/shardfeed/locations.json``, written by ``shardfeed stage``) is read
through its tier copies: each shard from the first copy that passes those same checks, trying node
tiers (the node's own copy, if any), then the shared tiers holding the file, faster first, then
the dataset itself. A copy that is missing or fails a check is skipped with a warning on the
``shardfeed`` logger; :meth:`Dataset.shard_source` tells which tier served a shard.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs

from shardfeed.formats.columns import column_to_numpy
from shardfeed.formats.encoding import ShardContext, ShardFile, get_encoding
from shardfeed.formats.errors import CorruptShardError, IncompleteDatasetError
from shardfeed.formats.layout import INFO_PATH
from shardfeed.formats.retry import ObjectStoreIOError
from shardfeed.formats.storage import Location, locate
from shardfeed.schemas.errors import SchemaError, ShardfeedError
from shardfeed.schemas.features import FeatureSpec
from shardfeed.schemas.info import Info
from shardfeed.schemas.locations import LOCATIONS_PATH, Locations
from shardfeed.schemas.manifest import MANIFEST_PATH, Manifest, ShardRecord, SplitRecord
from shardfeed.schemas.sidecar import DatasetRef

Batch = dict[str, np.ndarray]
_ROW_GROUP_CACHE = 4  # decoded row groups kept for ds[i] and small reads
SOURCE = "source"  # what Dataset.shard_source names the dataset itself
CACHE = "cache"  # what Dataset.shard_source names a node cache's copy
NO_LOCATIONS_ENV = "SHARDFEED_NO_LOCATIONS"  # "1": read every shard from the dataset itself
#: what a tier copy that cannot be used raises while being opened or read
_COPY_ERRORS = (OSError, ValueError, ShardfeedError, pa.ArrowException)

log = logging.getLogger("shardfeed")


def load_manifest(location: Location) -> Manifest:
    """Parse the manifest strictly; a missing one means the dataset is not complete."""
    try:
        text = location.read_bytes(MANIFEST_PATH)
    except (FileNotFoundError, OSError) as err:
        if (
            isinstance(err, FileNotFoundError)
            or "not found" in str(err).lower()
            or "no such file" in str(err).lower()
        ):
            raise IncompleteDatasetError(
                f"{location.display}: no {MANIFEST_PATH}; not a complete shardfeed dataset (an interrupted job leaves none)"
            ) from None
        raise
    return Manifest.loads(text, source=f"{location.display}/{MANIFEST_PATH}")


def load_locations(location: Location, manifest: Manifest) -> Locations | None:
    """The dataset's staged copies (``meta/shardfeed/locations.json``), or None if it has none.

    Never fatal: a file that cannot be read or parsed, or that was written for another dataset
    (fingerprint, samples or shards differ from ``manifest``), is ignored with a warning.
    """
    where = f"{location.display}/{LOCATIONS_PATH}"
    try:
        if location.info(LOCATIONS_PATH).type == pafs.FileType.NotFound:
            return None
        locations = Locations.loads(location.read_bytes(LOCATIONS_PATH), source=where)
    except _COPY_ERRORS as err:
        log.warning("%s ignored, shards are read from the dataset itself: %s", where, err)
        return None
    ref = DatasetRef(manifest.fingerprint, manifest.num_samples, len(manifest.shards))
    if locations.dataset != ref:
        log.warning(
            "%s ignored, shards are read from the dataset itself: it was written for dataset %s "
            "(%d samples, %d shards), not this one, %s (%d samples, %d shards)",
            where,
            locations.dataset.fingerprint,
            locations.dataset.num_samples,
            locations.dataset.num_shards,
            ref.fingerprint,
            ref.num_samples,
            ref.num_shards,
        )
        return None
    return locations


def tier_preference(locations: Locations) -> tuple[str, ...]:
    """Tier names in the order a reader tries them: node tiers, then shared tiers; within each,
    higher declared read bandwidth first, ties by name. The dataset itself comes after all."""
    tiers = locations.tiers
    return tuple(
        sorted(tiers, key=lambda n: (tiers[n].scope != "node", -tiers[n].read_bandwidth, n))
    )


class ShardCache(Protocol):
    """A node-local cache of whole shard files that a :class:`Dataset` reads through
    (``shardfeed.formats.node_cache.NodeCache``)."""

    def fetch(self, source: Location, record: ShardRecord) -> tuple[Location, bool] | None:
        """A local root holding a verified copy of ``record.path`` and whether it was copied in
        just now (from ``source``), or None when the cache declines it (no room)."""
        ...

    def discard(self, record: ShardRecord) -> None:
        """Drop the cached copy of ``record.path`` (it failed a check while being read)."""
        ...


class _ShardMissing(CorruptShardError):
    """The shard file is not there (normal for a node tier: each node holds a subset)."""


class _TierCopies:
    """The tier copies a dataset's shards may be read from, with each tier's root located on
    first use (an object-store filesystem is only built when a shard needs it)."""

    def __init__(
        self, locations: Locations, filesystems: Mapping[str, pafs.FileSystem] | None
    ) -> None:
        self.locations = locations
        self.order = tier_preference(locations)
        self._filesystems = dict(filesystems or {})
        self._roots: dict[str, Location | None] = {}

    def is_node(self, tier: str) -> bool:
        return self.locations.tiers[tier].scope == "node"

    def candidates(self, rel: str) -> list[str]:
        """Tiers that may hold ``rel``, in preference order: every node tier (probed), and the
        shared tiers ``locations.json`` lists for it."""
        held = self.locations.files.get(rel, ())
        return [t for t in self.order if self.is_node(t) or t in held]

    def root(self, tier: str) -> Location | None:
        """The tier's root, or None (warned once) if its URI cannot be reached."""
        if tier not in self._roots:
            uri = self.locations.tiers[tier].uri
            try:
                self._roots[tier] = locate(uri, self._filesystems.get(tier))
            except _COPY_ERRORS as err:
                log.warning("tier %r (%s) skipped: cannot reach it: %s", tier, uri, err)
                self._roots[tier] = None
        return self._roots[tier]


class Dataset:
    """A read-only view of a published dataset. ``len(ds)``, ``ds[i]``, ``read``, ``take``, ``verify``.

    ``location`` is the dataset itself; with ``locations`` (its staged copies), shards are read
    from tier copies when they pass the checks (see the module docstring). ``tier_filesystems``
    maps a tier name to the pyarrow filesystem its URI lives on; by default the URI picks one.
    """

    def __init__(
        self,
        location: Location,
        manifest: Manifest,
        info: Info,
        *,
        locations: Locations | None = None,
        tier_filesystems: Mapping[str, pafs.FileSystem] | None = None,
        check_hashes: bool = False,
    ) -> None:
        self.location = location
        #: hash each shard copy when it is opened (a same-size substitute passes the cheap checks)
        self.check_hashes = check_hashes
        self.manifest = manifest
        self.info = info
        self.locations = locations
        self._tiers = _TierCopies(locations, tier_filesystems) if locations is not None else None
        self.features: FeatureSpec = info.features
        self._encoding = get_encoding(manifest.encoding)
        self._starts = [s.index_start for s in manifest.shards]
        self._group_starts = [
            np.concatenate([[0], np.cumsum(s.row_groups)]).tolist() for s in manifest.shards
        ]
        self._files: dict[int, ShardFile] = {}
        self._handles: dict[int, Any] = {}
        self._served: dict[int, str] = {}  # shard -> tier its open file is on (SOURCE: the dataset)
        self._served_location: dict[int, Location] = {}
        self._served_path: dict[int, str] = {}  # local shards: the checked path of the open copy
        self._rejected: dict[int, set[str]] = {}  # shard -> tiers whose copy failed a check
        self._cache: OrderedDict[tuple[int, int, tuple[str, ...]], pa.Table] = OrderedDict()
        self._schema = self.features.arrow_schema()
        self._lock = threading.RLock()  # loaders open shards from several threads
        self._thread_files = threading.local()  # shard -> (shared file, this thread's file)
        self._node_cache: ShardCache | None = None
        self.copied_to_cache: set[int] = set()  # shards this object copied into the node cache
        self._record_offsets: np.ndarray | None = None  # framed encodings, read on first open

    # -- size and lookup -------------------------------------------------------------------------
    def __len__(self) -> int:
        return self.manifest.num_samples

    @property
    def shards(self) -> tuple[ShardRecord, ...]:
        return self.manifest.shards

    def split(self, name: str) -> SplitRecord:
        """The named split (``convert --split``): its rows ``[index_start, index_end)`` and
        shards ``[shard_start, shard_end)``; ``ShardLoader(..., split=name)`` reads only it.
        An unknown name is a ValueError naming the splits."""
        return self.manifest.split(name)

    def locate(self, index: int) -> tuple[int, int, int]:
        """(shard, row group, row within group) of a global index, by two binary searches."""
        if not 0 <= index < len(self):
            raise IndexError(f"index {index} out of range for dataset of {len(self)} samples")
        shard = bisect.bisect_right(self._starts, index) - 1
        row = index - self._starts[shard]
        starts = self._group_starts[shard]
        group = bisect.bisect_right(starts, row) - 1
        return shard, group, row - starts[group]

    # -- reads -----------------------------------------------------------------------------------
    def __getitem__(self, index: int) -> dict[str, Any]:
        if index < 0:
            index += len(self)
        batch = self.read(index, index + 1)
        return {name: values[0] for name, values in batch.items()}

    def read(self, start: int, stop: int, columns: Sequence[str] | None = None) -> Batch:
        """Rows ``[start, stop)`` as a dict of numpy arrays (tensors as ``(N, *shape)``)."""
        names = self._columns(columns)
        start, stop = max(0, start), min(stop, len(self))
        if start >= stop:
            return self._to_numpy(self._schema.empty_table().select(names), names)
        tables = []
        shard = bisect.bisect_right(self._starts, start) - 1
        while shard < len(self.shards) and self._starts[shard] < stop:
            record = self.shards[shard]
            lo = max(start, record.index_start) - record.index_start
            hi = min(stop, record.index_end) - record.index_start
            tables.append(self._read_shard_rows(shard, lo, hi, names))
            shard += 1
        return self._to_numpy(pa.concat_tables(tables), names)

    def take(
        self, indices: Sequence[int] | np.ndarray, columns: Sequence[str] | None = None
    ) -> Batch:
        """Rows at ``indices`` (any order, repeats allowed); each needed row group is read once."""
        names = self._columns(columns)
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        if len(idx) == 0:
            return self._to_numpy(self._schema.empty_table().select(names), names)
        if idx.min() < -len(self) or idx.max() >= len(self):
            raise IndexError(f"indices out of range for dataset of {len(self)} samples")
        idx = np.where(idx < 0, idx + len(self), idx)
        order = np.argsort(idx, kind="stable")
        sorted_idx = idx[order]
        pieces = []
        shard_of = np.searchsorted(self._starts, sorted_idx, side="right") - 1
        for shard in np.unique(shard_of).tolist():
            rows = sorted_idx[shard_of == shard] - self._starts[shard]
            group_starts = np.asarray(self._group_starts[shard])
            group_of = np.searchsorted(group_starts, rows, side="right") - 1
            groups = np.unique(group_of).tolist()
            table = self._read_groups(shard, groups, names)
            # offsets of each needed group inside the concatenated table
            lengths = np.diff(group_starts)[groups]
            base = dict(
                zip(groups, np.concatenate([[0], np.cumsum(lengths)[:-1]]).tolist(), strict=True)
            )
            local = np.array([base[g] for g in group_of.tolist()]) + (rows - group_starts[group_of])
            pieces.append(table.take(pa.array(local)))
        table = pa.concat_tables(pieces)
        inverse = np.empty_like(order)
        inverse[order] = np.arange(len(order))
        return self._to_numpy(table.take(pa.array(inverse)), names)

    def shard_source(self, shard: int) -> str:
        """The tier shard ``shard`` is read from (e.g. ``"nvme"``, ``"pfs"``; ``"source"`` for the
        dataset itself), resolving it now if nothing has read it yet."""
        if not 0 <= shard < len(self.shards):
            raise IndexError(f"shard {shard} out of range for {len(self.shards)} shards")
        self._open(shard)
        return self._served[shard]

    def is_open(self, shard: int) -> bool:
        """Whether ``shard`` has been resolved to a copy and opened already."""
        return shard in self._files

    @property
    def node_cache(self) -> ShardCache | None:
        return self._node_cache

    def local_extent(self, shard: int, group: int) -> tuple[str, int, int] | None:
        """``(path, start, end)``: the local file and byte range row group ``group`` of ``shard``
        is read from, or None when the shard is served from an object store."""
        shard_file = self._open(shard)
        path = self._served_path.get(shard)
        if path is None:
            return None
        start, end = shard_file.group_extent(group)
        return path, start, end

    def read_row_group(
        self, shard: int, group: int, columns: Sequence[str] | None = None
    ) -> pa.Table:
        """Row group ``group`` of ``shard`` as an Arrow table (the unit loaders read). Safe to
        call from several threads: each decodes local shards through its own open file."""
        names = self._columns(columns)
        shared = self._open(shard)
        location = self._served_location.get(shard)
        if location is None or not location.is_local:
            with self._lock:  # one shared handle per remote shard: reads take turns
                return self._read_groups(shard, [group], names)
        files = self._thread_files.__dict__.setdefault("files", {})
        mine = files.get(shard)
        try:
            if mine is None or mine[0] is not shared:
                path = location.path(self.shards[shard].path)
                opened = self._encoding.open(path, self._context(shard))
                mine = files[shard] = (shared, opened)
            return mine[1].read_row_groups([group], names)
        except (OSError, ValueError, pa.ArrowException):
            files.pop(shard, None)
            with self._lock:  # the shared path rejects the copy and reads the next one
                return self._read_groups(shard, [group], names)

    def served_on_node(self, shard: int) -> bool:
        """Whether ``shard`` was already on this node when opened: a node tier's copy, or a
        node cache copy that this object did not have to copy in."""
        if shard in self.copied_to_cache:
            return False
        tier = self.shard_source(shard)
        return tier == CACHE or (
            self._tiers is not None
            and tier in self._tiers.locations.tiers
            and self._tiers.is_node(tier)
        )

    def attach_cache(self, cache: ShardCache | None) -> None:
        """Read shards that no node tier holds through ``cache`` (a node-local copy), from
        shards opened after this call on."""
        self._node_cache = cache

    def iter_batches(
        self, batch_size: int, columns: Sequence[str] | None = None
    ) -> Iterator[Batch]:
        """Sequential batches over the whole dataset, in file order."""
        for start in range(0, len(self), batch_size):
            yield self.read(start, start + batch_size, columns)

    def verify(self, *, check_hashes: bool = True):
        """Recompute sha256, sizes and row counts of every listed file; see ``verify_dataset``."""
        from shardfeed.formats.verify import verify_location

        return verify_location(self.location, self.manifest, check_hashes=check_hashes)

    # -- internals -------------------------------------------------------------------------------
    def _columns(self, columns: Sequence[str] | None) -> list[str]:
        if columns is None:
            return list(self._schema.names)
        names = list(columns)
        unknown = [c for c in names if c not in self._schema.names]
        if unknown:
            raise KeyError(
                f"unknown or unstored columns {unknown}; stored columns are {self._schema.names}"
            )
        return names

    def _to_numpy(self, table: pa.Table, names: list[str]) -> Batch:
        return {name: column_to_numpy(table.column(name), self.features[name]) for name in names}

    def _read_shard_rows(self, shard: int, lo: int, hi: int, names: list[str]) -> pa.Table:
        starts = self._group_starts[shard]
        first = bisect.bisect_right(starts, lo) - 1
        last = bisect.bisect_right(starts, hi - 1) - 1
        if first == last:
            return self._group(shard, first, names).slice(lo - starts[first], hi - lo)
        # whole groups go through the small cache, so sequential reads decode each group once
        pieces = [self._group(shard, g, names) for g in range(first, last + 1)]
        return pa.concat_tables(pieces).slice(lo - starts[first], hi - lo)

    def _group(self, shard: int, group: int, names: list[str]) -> pa.Table:
        key = (shard, group, tuple(names))
        cached = self._cache.get(key)
        if cached is not None:
            self._cache.move_to_end(key)
            return cached
        table = self._read_groups(shard, [group], names)
        self._cache[key] = table
        if len(self._cache) > _ROW_GROUP_CACHE:
            self._cache.popitem(last=False)
        return table

    def _read_groups(self, shard: int, groups: list[int], names: list[str]) -> pa.Table:
        shard_file = self._open(shard)
        try:
            return shard_file.read_row_groups(groups, names)
        except (OSError, ValueError, pa.ArrowException) as err:
            served = self._served[shard]
            if served == SOURCE:
                raise CorruptShardError(
                    f"{self.shards[shard].path}: cannot read row groups {groups}: {err}"
                ) from None
            problem = f"cannot read row groups {groups}: {err}"
        # a copy that passed the open checks but fails a page checksum: drop it and read from
        # the next copy (each retry rejects one tier or the cache; the dataset ends the chain)
        if served == CACHE:
            self._rejected.setdefault(shard, set()).add(CACHE)
            log.warning("node cache copy of %s dropped: %s", self.shards[shard].path, problem)
            self._forget(shard)
            self._node_cache.discard(self.shards[shard])
        else:
            self._reject(shard, served, problem)
            self._forget(shard)
        return self._read_groups(shard, groups, names)

    def _open(self, shard: int) -> ShardFile:
        """The shard's open file: from the first tier copy that passes the checks, else from the
        dataset itself (whose errors are raised). With a node cache attached, a shard no node
        tier holds is read from the cache's copy of the first shared copy that passes."""
        found = self._files.get(shard)
        if found is not None:
            return found
        with self._lock:
            found = self._files.get(shard)
            if found is not None:
                return found
            if self._tiers is not None:
                rejected = self._rejected.get(shard, set())
                for tier in self._tiers.candidates(self.shards[shard].path):
                    root = None if tier in rejected else self._tiers.root(tier)
                    if root is None:
                        continue
                    try:
                        if self._tiers.is_node(tier):
                            return self._open_at(shard, tier, root)
                        return self._through_cache(shard, tier, root)
                    except _ShardMissing as err:
                        if not self._tiers.is_node(tier):
                            self._reject(shard, tier, str(err))
                        # else: this node holds no copy of the shard, the usual case
                    except _COPY_ERRORS as err:
                        self._reject(shard, tier, str(err))
            return self._through_cache(shard, SOURCE, self.location)

    def _through_cache(self, shard: int, tier: str, root: Location) -> ShardFile:
        """Open the shard from ``root``, or from the node cache's copy of it when a cache is
        attached and takes it. A copy that fails its hash is the source's fault: it raises."""
        if self._node_cache is not None and CACHE not in self._rejected.get(shard, ()):
            record = self.shards[shard]
            self._open_at(shard, tier, root)  # the source passes the cheap checks first
            self._forget(shard)
            cached = self._node_cache.fetch(root, record)
            if cached is not None:
                try:
                    opened = self._open_at(shard, CACHE, cached[0])
                    if cached[1]:
                        self.copied_to_cache.add(shard)
                    return opened
                except _COPY_ERRORS as err:  # evicted or damaged since: read the source
                    log.warning("node cache copy of %s not used: %s", record.path, err)
        return self._open_at(shard, tier, root)

    def _reject(self, shard: int, tier: str, problem: str) -> None:
        """Skip ``tier``'s copy of ``shard`` from now on, with a warning."""
        self._rejected.setdefault(shard, set()).add(tier)
        rel = self.shards[shard].path
        log.warning(
            "tier %r copy of %s not used (%s): %s; trying the next copy",
            tier,
            rel,
            self.locations.uri(tier, rel),
            problem.removeprefix(f"{rel}: "),
        )

    def _open_at(self, shard: int, tier: str, location: Location) -> ShardFile:
        """Open the shard under ``location`` and check it against its record (size, footer rows
        and row groups, schema; no hashing)."""
        record = self.shards[shard]
        field = f"shards[{shard}].path"
        info = location.info(record.path, field)
        if info.type == pafs.FileType.NotFound:
            raise _ShardMissing(f"{record.path}: shard is missing")
        if info.size != record.bytes:
            raise CorruptShardError(
                f"{record.path}: size {info.size} bytes, manifest says {record.bytes}"
            )
        # a shard without a footer hash to check on open (TFRecord) is hashed whole instead:
        # otherwise a valid shard in its place would be read without a word
        if self.check_hashes or (record.footer_sha256 is None and self._encoding.framed):
            _check_sha256(location, record.path, record.sha256, field)
        handle = None
        if location.is_local:
            source: Any = location.path(record.path, field)  # checked once per open
        else:
            source = handle = location.open_input(record.path, field)
        try:
            shard_file = self._checked(shard, source)
        except BaseException:
            if handle is not None:
                handle.close()
            raise
        if handle is not None:
            self._handles[shard] = handle
        self._files[shard] = shard_file
        self._served[shard] = tier
        self._served_location[shard] = location
        if location.is_local:
            self._served_path[shard] = source
        return shard_file

    def _checked(self, shard: int, source: Any) -> ShardFile:
        record = self.shards[shard]
        try:
            shard_file = self._encoding.open(source, self._context(shard))
        except ObjectStoreIOError:
            raise  # the store never answered: an I/O error, not a corrupt shard
        except (OSError, ValueError, pa.ArrowException) as err:
            raise CorruptShardError(f"{record.path}: unreadable shard footer: {err}") from None
        if (
            shard_file.num_rows != record.rows
            or tuple(shard_file.row_group_rows) != record.row_groups
        ):
            raise CorruptShardError(
                f"{record.path}: footer has {shard_file.num_rows} rows in groups {shard_file.row_group_rows[:8]}, "
                f"manifest says {record.rows} rows in groups {list(record.row_groups[:8])}"
            )
        schema = getattr(shard_file, "schema", None)
        if schema is not None and not schema.remove_metadata().equals(self._schema):
            raise CorruptShardError(f"{record.path}: schema does not match meta/info.json features")
        if record.footer_sha256 is not None:
            try:
                footer = shard_file.footer_sha256()
            except ObjectStoreIOError:
                raise
            except (OSError, ValueError, pa.ArrowException) as err:
                raise CorruptShardError(f"{record.path}: unreadable shard footer: {err}") from None
            if footer != record.footer_sha256:
                raise CorruptShardError(
                    f"{record.path}: footer sha256 {str(footer)[:16]}… is not the manifest's "
                    f"{record.footer_sha256[:16]}…: this file is not the shard the manifest lists"
                )
        return shard_file

    def _context(self, shard: int) -> ShardContext | None:
        """What a framed encoding needs to open ``shard``: its rows' record offsets."""
        if not self._encoding.framed:
            return None
        if self._record_offsets is None:
            from shardfeed.formats.sample_index import read_record_offsets

            self._record_offsets = read_record_offsets(self.location, self.manifest)
        record = self.shards[shard]
        return ShardContext(
            self.features,
            record.row_groups,
            self._record_offsets[record.index_start : record.index_end],
        )

    def _forget(self, shard: int) -> None:
        handle = self._handles.pop(shard, None)
        if handle is not None:
            handle.close()
        self._files.pop(shard, None)
        self._served.pop(shard, None)
        self._served_location.pop(shard, None)
        self._served_path.pop(shard, None)

    def close(self) -> None:
        for handle in self._handles.values():
            handle.close()
        self._handles.clear()
        self._files.clear()
        self._served.clear()
        self._served_location.clear()
        self._served_path.clear()
        self._rejected.clear()
        self._cache.clear()

    def __enter__(self) -> Dataset:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Dataset({self.location.display!r}, samples={len(self)}, shards={len(self.shards)})"


def open_dataset(
    path: str | os.PathLike[str],
    *,
    filesystem: pafs.FileSystem | None = None,
    use_locations: bool = True,
    tier_filesystems: Mapping[str, pafs.FileSystem] | None = None,
    check_hashes: bool = False,
) -> Dataset:
    """Open a published dataset (local path or URI such as ``s3://bucket/ds``).

    Refuses a directory with no valid manifest, a manifest path that escapes the root (``..``,
    absolute, or a symlink out), and an ``info.json`` that disagrees with the manifest.

    A staged dataset is read through its tier copies (see the module docstring) unless
    ``use_locations`` is False or the environment sets ``SHARDFEED_NO_LOCATIONS=1``.
    ``tier_filesystems`` maps a tier name to the pyarrow filesystem of its URI (e.g. an
    ``S3FileSystem`` with an endpoint); by default the URI and environment pick one.

    ``check_hashes``: also check each shard's sha256 when it is first opened (one extra full
    read per shard). Without it a shard swapped for another valid one of the same size, rows and
    schema is read unnoticed; ``verify`` and the node cache's copies always hash.
    """
    location = locate(path, filesystem)
    manifest = load_manifest(location)
    info_record = next((f for f in manifest.files if f.path == INFO_PATH), None)
    if info_record is None:
        raise SchemaError(
            "files",
            f"the manifest does not list {INFO_PATH}",
            source=f"{location.display}/{MANIFEST_PATH}",
        )
    for i, record in enumerate(manifest.shards):
        location.path(record.path, f"shards[{i}].path")  # refuse escapes before any read
    try:
        info_bytes = location.read_bytes(INFO_PATH)
    except FileNotFoundError:
        raise IncompleteDatasetError(f"{location.display}: {INFO_PATH} is missing") from None
    if hashlib.sha256(info_bytes).hexdigest() != info_record.sha256:
        raise CorruptShardError(f"{INFO_PATH}: sha256 does not match the manifest")
    info = Info.from_json(_json(info_bytes, INFO_PATH), source=f"{location.display}/{INFO_PATH}")
    if info.total_frames != manifest.num_samples:
        raise SchemaError(
            "total_frames",
            f"{info.total_frames} disagrees with the manifest's {manifest.num_samples} samples",
            source=INFO_PATH,
        )
    locations = None
    if use_locations and os.environ.get(NO_LOCATIONS_ENV) != "1":
        locations = load_locations(location, manifest)
    return Dataset(
        location,
        manifest,
        info,
        locations=locations,
        tier_filesystems=tier_filesystems,
        check_hashes=check_hashes,
    )


def _check_sha256(location: Location, rel: str, sha256: str, field: str) -> None:
    """Raise CorruptShardError unless the file ``rel`` under ``location`` hashes to ``sha256``."""
    digest = hashlib.sha256()
    with location.filesystem.open_input_stream(location.path(rel, field), compression=None) as s:
        while chunk := s.read(8 << 20):
            digest.update(chunk)
    if digest.hexdigest() != sha256:
        raise CorruptShardError(f"{rel}: sha256 does not match the manifest")


def _json(data: bytes, source: str) -> Any:
    try:
        return json.loads(data)
    except ValueError as err:
        raise SchemaError("<root>", f"not valid JSON ({err})", source=source) from None
    except RecursionError:
        raise SchemaError("<root>", "not valid JSON (nested too deeply)", source=source) from None
