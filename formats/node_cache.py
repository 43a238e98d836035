"""A node-local cache of whole shard files under a byte budget: pinned shards, then LRU.

Loaders on one node share the directory. Every admission (check, evict, copy, rename) runs under
an ``flock`` on ``ROOT/.lock``, so concurrent loaders never overshoot the budget together, and a
copy is published only once its sha256 matched the manifest (``tier_copy.copy_file``). Layout::

    ROOT/.lock
    ROOT/<dataset fingerprint>/pinned/<shard path>   never evicted by the cache
    ROOT/<dataset fingerprint>/lru/<shard path>      evicted least recently used first

Use order is the file's mtime, touched on every hit (``atime`` is often off on NVMe mounts).
The budget counts every file under ROOT, pinned ones and other datasets' included. Only this
cache's own directories are ever modified: the tiers it copies from are only read.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass

from shardfeed.formats.atomic import is_temp_name
from shardfeed.formats.storage import Location, locate
from shardfeed.formats.tier_copy import Target, copy_file, remove_temporaries
from shardfeed.schemas.manifest import ShardRecord

LOCK_NAME = ".lock"
PINNED, LRU = "pinned", "lru"

log = logging.getLogger("shardfeed")


@dataclass
class CacheCounters:
    """What one cache object saw: hits, misses (copied in), declines (no room), evictions."""

    hits: int = 0
    misses: int = 0
    declined: int = 0
    evicted: int = 0
    bytes_copied: int = 0


class NodeCache:
    """Whole-shard cache at ``root`` for the dataset with ``fingerprint``, ``budget`` bytes in all.

    ``pinned``: shard paths that go to ``pinned/`` (the node's hot shards) and are never evicted;
    they still count toward the budget, and one that cannot fit is read through uncached.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        budget: int,
        fingerprint: str,
        pinned: Iterable[str] = (),
    ) -> None:
        if budget <= 0:
            raise ValueError(f"cache budget must be positive, got {budget}")
        if not fingerprint or "/" in fingerprint or fingerprint.startswith("."):
            raise ValueError(f"bad dataset fingerprint {fingerprint!r} for a cache directory")
        self.root = os.path.abspath(os.fspath(root))
        self.budget = int(budget)
        self.fingerprint = fingerprint
        self.pinned = frozenset(pinned)
        self.counters = CacheCounters()
        os.makedirs(self.root, exist_ok=True)

    # -- the ShardCache protocol of formats.reader ---------------------------------------------
    def fetch(self, source: Location, record: ShardRecord) -> tuple[Location, bool] | None:
        """A local root holding a verified copy of ``record.path`` and whether it was copied
        in now, from ``source``, if there was room (evicting LRU entries); None when it does
        not fit."""
        kind = PINNED if record.path in self.pinned else LRU
        base = self._base(kind)
        path = os.path.join(base, record.path)
        if self._present(path, record):
            self.counters.hits += 1
            return locate(base), False
        with self._locked():
            if self._present(path, record):  # another loader copied it while we waited
                self.counters.hits += 1
                return locate(base), False
            for target in self._dataset_dirs():
                remove_temporaries(Target(target))  # left by a loader killed mid-copy
            if not self._make_room(record.bytes, keep=path):
                self.counters.declined += 1
                return None
            try:
                copy_file(source, Target(base), record.path, record.bytes, record.sha256)
            except OSError as err:  # a full or failing cache disk: read through instead
                log.warning("node cache: cannot copy %s into %s: %s", record.path, base, err)
                self.counters.declined += 1
                return None
        self.counters.misses += 1
        self.counters.bytes_copied += record.bytes
        return locate(base), True

    def discard(self, record: ShardRecord) -> None:
        with self._locked():
            for kind in (PINNED, LRU):
                path = os.path.join(self._base(kind), record.path)
                if os.path.lexists(path):
                    os.unlink(path)

    # -- inspection ----------------------------------------------------------------------------
    def usage(self) -> int:
        """Bytes of every file under the cache root (all datasets, temporaries included)."""
        return sum(size for _, size, _, _ in self._entries())

    def entries(self, kind: str | None = None) -> list[str]:
        """Cached shard paths of this dataset (``kind``: ``pinned`` or ``lru``; None: both)."""
        out = []
        for kind_dir in (PINNED, LRU) if kind is None else (kind,):
            base = self._base(kind_dir)
            for dirpath, _, names in os.walk(base):
                for name in names:
                    if not is_temp_name(name):
                        out.append(os.path.relpath(os.path.join(dirpath, name), base))
        return sorted(out)

    def clear(self) -> None:
        """Remove this dataset's cached shards (pinned ones too)."""
        with self._locked():
            shutil.rmtree(os.path.join(self.root, self.fingerprint), ignore_errors=True)

    # -- internals -----------------------------------------------------------------------------
    def _base(self, kind: str) -> str:
        return os.path.join(self.root, self.fingerprint, kind)

    def _dataset_dirs(self) -> list[str]:
        return [d for d in (self._base(PINNED), self._base(LRU)) if os.path.isdir(d)]

    @staticmethod
    def _present(path: str, record: ShardRecord) -> bool:
        """A published copy of the right size (its hash was checked when it was copied in; a
        reader still checks its footer, and its page checksums on every read)."""
        try:
            if os.path.getsize(path) != record.bytes:
                return False
            os.utime(path)  # most recently used
            return True
        except OSError:
            return False

    def _entries(self) -> Iterator[tuple[str, int, float, bool]]:
        """``(path, size, mtime, evictable)`` of every file under the root but the lock."""
        for dirpath, _, names in os.walk(self.root):
            for name in names:
                path = os.path.join(dirpath, name)
                if path == os.path.join(self.root, LOCK_NAME):
                    continue
                try:
                    stat = os.stat(path)
                except FileNotFoundError:
                    continue
                rel = os.path.relpath(path, self.root).split(os.sep)
                evictable = len(rel) > 2 and rel[1] == LRU and not is_temp_name(name)
                yield path, stat.st_size, stat.st_mtime, evictable

    def _make_room(self, need: int, keep: str) -> bool:
        """Evict LRU files (any dataset's) until ``need`` more bytes fit; False if they can't."""
        entries = list(self._entries())
        used = sum(size for _, size, _, _ in entries)
        if used + need <= self.budget:
            return True
        victims = sorted((e for e in entries if e[3] and e[0] != keep), key=lambda e: e[2])
        free_able = sum(size for _, size, _, _ in victims)
        if used - free_able + need > self.budget:
            return False
        for path, size, _, _ in victims:
            if used + need <= self.budget:
                break
            with suppress(FileNotFoundError):
                os.unlink(path)
            used -= size
            self.counters.evicted += 1
        return True

    @contextmanager
    def _locked(self) -> Iterator[None]:
        fd = os.open(os.path.join(self.root, LOCK_NAME), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)
