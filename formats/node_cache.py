"""A node-local cache of whole shard files under a byte budget: pinned shards, then LRU.

Loaders on one node share the directory. An ``flock`` on ``ROOT/.lock`` guards the bookkeeping
only: under it a loader decides admission, evicts, and *claims* the bytes of its copy; it copies
and hashes with the lock released, so loaders wanting different shards copy at once; it takes
the lock again to publish (rename) the verified copy and drop its claim. A claim counts toward
the budget as its declared bytes (or the bytes its copy holds, if more) until it is dropped, so
concurrent loaders never overshoot the budget together. Layout::

    ROOT/.lock
    ROOT/.copies/<host>-<pid>-<id>.claim              one copy in flight: declared bytes, target
    ROOT/.copies/<host>-<pid>-<id>/<shard path>       its staging directory
    ROOT/<dataset fingerprint>/pinned/<shard path>   never evicted by the cache
    ROOT/<dataset fingerprint>/lru/<shard path>      evicted least recently used first

The copier holds an ``flock`` on its claim file from the moment it claims until it has dropped
the claim; the kernel releases it when the process dies, so a claim nobody holds is a dead
copier's, and the next admission deletes it and its staging directory (no pid-reuse guesswork).
A loader wanting a shard another loader is copying waits for that copy (a shared ``flock`` on
its claim) instead of copying it again; one that fits only once copies in flight to ``lru/``
have landed, and can be evicted, waits for them the same way. A copy lands in the cache only once its size and sha256
matched the manifest (``tier_copy.copy_file`` into the staging directory, then a rename).

Use order is the file's mtime, touched on every hit (``atime`` is often off on NVMe mounts).
The budget counts every file under ROOT, pinned ones and other datasets' included, plus every
live claim. Only this cache's own directories are ever modified: the tiers it copies from are
only read.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import re
import shutil
import socket
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass

from shardfeed.formats.atomic import fsync_dir, is_temp_name
from shardfeed.formats.storage import Location, locate
from shardfeed.formats.tier_copy import Target, copy_file, remove_temporaries
from shardfeed.schemas.manifest import ShardRecord

LOCK_NAME = ".lock"
COPIES = ".copies"  # claims and staging directories of copies in flight
CLAIM = ".claim"
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


@dataclass(frozen=True)
class _Claim:
    """A copy in flight: its claim file, staging directory, target (relative to the cache
    root) and the bytes it counts toward the budget; ``fd`` holds the claim's ``flock`` in the
    loader that made it (-1 in the others)."""

    path: str
    staging: str
    target: str
    bytes: int
    fd: int = -1


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
        claim = self._admit(path, record)
        if claim is None:
            return None
        if claim is True:  # another loader copied it while we waited
            return locate(base), False
        try:
            copy_file(source, Target(claim.staging), record.path, record.bytes, record.sha256)
            with self._locked():
                os.makedirs(os.path.dirname(path), exist_ok=True)
                os.replace(os.path.join(claim.staging, record.path), path)
                self._drop(claim)
                self.counters.misses += 1
                self.counters.bytes_copied += record.bytes
        except OSError as err:  # a full or failing cache disk: read through instead
            log.warning("node cache: cannot copy %s into %s: %s", record.path, base, err)
            self.counters.declined += 1
            return None
        finally:
            self._release(claim)
        fsync_dir(os.path.dirname(path))
        return locate(base), True

    def discard(self, record: ShardRecord) -> None:
        with self._locked():
            for kind in (PINNED, LRU):
                path = os.path.join(self._base(kind), record.path)
                if os.path.lexists(path):
                    os.unlink(path)

    # -- inspection ----------------------------------------------------------------------------
    def usage(self) -> int:
        """Bytes the budget sees: every file under the cache root (all datasets) plus every
        copy in flight at its claimed size (a dead loader's claim is cleared on the way)."""
        with self._locked():
            return self._used(self._claims())

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
        """Remove this dataset's cached shards (pinned ones too; copies in flight still land)."""
        with self._locked():
            shutil.rmtree(os.path.join(self.root, self.fingerprint), ignore_errors=True)

    # -- admission -----------------------------------------------------------------------------
    def _admit(self, path: str, record: ShardRecord) -> _Claim | bool | None:
        """Under the lock: True if the shard is (now) present, None if it cannot fit, else this
        loader's claim on room for its copy, made after evicting. Waits, without the lock, for
        another loader's copy of the same shard, and for one that must land before it can be
        evicted to make room."""
        target = os.path.relpath(path, self.root)
        while True:
            with self._locked():
                if self._present(path, record):
                    self.counters.hits += 1
                    return True
                claims = self._claims()
                busy = next((c for c in claims if c.target == target), None)
                if busy is None:
                    for directory in self._dataset_dirs():
                        remove_temporaries(Target(directory))  # left by a pre-claims version
                    room = self._make_room(record.bytes, keep=path, claims=claims)
                    if room is False:
                        self.counters.declined += 1
                        return None
                    if room is True:
                        return self._claim(target, record.bytes)
                    busy = room
            _wait_for(busy)

    def _claim(self, target: str, nbytes: int) -> _Claim:
        """Claim ``nbytes`` for a copy to ``target`` (under the lock): the claim file, locked
        for as long as this process copies, then its staging directory."""
        copies = os.path.join(self.root, COPIES)
        os.makedirs(copies, exist_ok=True)
        host = re.sub(r"[^A-Za-z0-9.-]", "_", socket.gethostname()) or "host"
        name = f"{host}-{os.getpid()}-{uuid.uuid4().hex[:12]}"
        path, staging = os.path.join(copies, name + CLAIM), os.path.join(copies, name)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        claim = _Claim(path, staging, target, nbytes, fd)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            os.write(fd, json.dumps({"bytes": nbytes, "target": target}).encode())
            os.mkdir(staging)
        except BaseException:
            self._drop(claim)
            os.close(fd)
            raise
        return claim

    def _release(self, claim: _Claim) -> None:
        """Drop this loader's claim if it is still there (a failed copy), then let go of its
        ``flock``."""
        try:
            if os.path.exists(claim.path):
                with self._locked():
                    self._drop(claim)
        finally:
            os.close(claim.fd)

    @staticmethod
    def _drop(claim: _Claim) -> None:
        """Delete a claim's staging directory, then its claim file (under the lock)."""
        shutil.rmtree(claim.staging, ignore_errors=True)
        with suppress(FileNotFoundError):
            os.unlink(claim.path)

    def _claims(self) -> list[_Claim]:
        """The live claims (under the lock). A claim file nobody holds an ``flock`` on is a dead
        loader's: it is deleted with its staging directory, as is a staging directory with no
        claim file."""
        copies = os.path.join(self.root, COPIES)
        try:
            names = set(os.listdir(copies))
        except FileNotFoundError:
            return []
        live = []
        for name in sorted(names):
            path = os.path.join(copies, name)
            if not name.endswith(CLAIM):
                if name + CLAIM not in names:
                    shutil.rmtree(path, ignore_errors=True)
                continue
            staging = path[: -len(CLAIM)]
            try:
                fd = os.open(path, os.O_RDWR)
            except FileNotFoundError:
                continue
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:  # held: its copier is alive
                    record = json.loads(os.pread(fd, 1 << 16, 0))
                    claimed = max(int(record["bytes"]), _tree_bytes(staging))
                    live.append(_Claim(path, staging, record["target"], claimed))
                    continue
                log.warning("node cache: clearing the claim of a dead copier, %s", name)
                self._drop(_Claim(path, staging, "", 0))
            finally:
                os.close(fd)
        return live

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
        """``(path, size, mtime, evictable)`` of every file under the root but the lock and the
        copies in flight."""
        for dirpath, dirnames, names in os.walk(self.root):
            if dirpath == self.root:
                dirnames[:] = [d for d in dirnames if d != COPIES]
            for name in names:
                path = os.path.join(dirpath, name)
                if path == os.path.join(self.root, LOCK_NAME):
                    continue
                try:
                    stat = os.stat(path)
                except FileNotFoundError:
                    continue
                evictable = _is_lru(os.path.relpath(path, self.root)) and not is_temp_name(name)
                yield path, stat.st_size, stat.st_mtime, evictable

    def _used(self, claims: list[_Claim]) -> int:
        return sum(size for _, size, _, _ in self._entries()) + sum(c.bytes for c in claims)

    def _make_room(self, need: int, keep: str, claims: list[_Claim]) -> bool | _Claim:
        """Evict LRU files (any dataset's) until ``need`` more bytes fit beside the files and
        the ``claims`` of copies in flight: True. Else, nothing evicted, a copy in flight into
        ``lru/`` to wait for when there would be room once those land and can be evicted, or
        False: it can never fit (pinned files and copies are never evicted)."""
        entries = list(self._entries())
        used = sum(size for _, size, _, _ in entries) + sum(c.bytes for c in claims)
        if used + need <= self.budget:
            return True
        victims = sorted((e for e in entries if e[3] and e[0] != keep), key=lambda e: e[2])
        free_able = sum(size for _, size, _, _ in victims)
        if used - free_able + need > self.budget:
            landing = [c for c in claims if _is_lru(c.target)]
            if landing and used - free_able - sum(c.bytes for c in landing) + need <= self.budget:
                return landing[0]
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


def _wait_for(claim: _Claim) -> None:
    """Block until the loader holding ``claim`` has published or dropped its copy (without the
    cache lock, which that loader needs to publish)."""
    try:
        fd = os.open(claim.path, os.O_RDONLY)
    except FileNotFoundError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
    finally:
        os.close(fd)


def _is_lru(target: str) -> bool:
    """Whether a path relative to the cache root is in a dataset's ``lru/`` directory."""
    parts = target.split(os.sep)
    return len(parts) > 2 and parts[1] == LRU


def _tree_bytes(directory: str) -> int:
    total = 0
    for dirpath, _, names in os.walk(directory):
        for name in names:
            with suppress(FileNotFoundError):
                total += os.stat(os.path.join(dirpath, name)).st_size
    return total
