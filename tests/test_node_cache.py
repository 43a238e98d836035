"""NodeCache with loaders at once: copies overlap, the budget holds with copies in flight, a
second loader waits for a copy in flight, and a killed copier's claim is cleared."""

from __future__ import annotations

import fcntl
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path

import pytest
from staging_fixtures import dataset

from shardfeed.formats import node_cache
from shardfeed.formats.node_cache import COPIES, LOCK_NAME, NodeCache
from shardfeed.formats.reader import Dataset, open_dataset

WAIT = 10.0  # seconds a test waits for another thread before failing instead of hanging


@pytest.fixture(scope="module")
def ds(tmp_path_factory) -> Dataset:
    return open_dataset(dataset(tmp_path_factory.mktemp("node_cache") / "ds"))


def gate_copies(monkeypatch, before: Callable[[], None]) -> list[str]:
    """Make every cache copy call ``before()`` first; the shard paths copied, in order."""
    copied: list[str] = []
    real = node_cache.copy_file

    def copy(source, target, rel, size, sha256, **kwargs):
        copied.append(rel)
        before()
        real(source, target, rel, size, sha256, **kwargs)

    monkeypatch.setattr(node_cache, "copy_file", copy)
    return copied


def start(call: Callable[[], object]) -> Callable[[], object]:
    """Run ``call`` in a thread; the returned function joins it (failing after WAIT seconds)
    and gives its result or raises its error."""
    out: dict[str, object] = {}

    def run() -> None:
        try:
            out["result"] = call()
        except BaseException as err:  # handed to the joiner
            out["error"] = err

    thread = threading.Thread(target=run, daemon=True)
    thread.start()

    def join() -> object:
        thread.join(WAIT)
        assert not thread.is_alive(), "a cache fetch still runs after the wait"
        if "error" in out:
            raise out["error"]
        return out["result"]

    return join


def bytes_on_disk(root: Path) -> int:
    """Every byte under the cache root but the lock and the claim records, copies in flight
    included; read under the cache's lock, so no rename is seen half done."""
    fd = os.open(root / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        total = 0
        for dirpath, _, names in os.walk(root):
            for name in names:
                if name != LOCK_NAME and not name.endswith(".claim"):
                    with suppress(FileNotFoundError):  # a copy renamed in its staging directory
                        total += os.path.getsize(os.path.join(dirpath, name))
        return total
    finally:
        os.close(fd)


def leftovers(root: Path) -> list[str]:
    copies = root / COPIES
    return sorted(os.listdir(copies)) if copies.is_dir() else []


def test_loaders_copy_different_shards_at_once(ds, tmp_path, monkeypatch):
    both_copying = threading.Barrier(2, timeout=WAIT)  # broken if the copies run one at a time
    gate_copies(monkeypatch, both_copying.wait)
    a, b = ds.shards[:2]
    caches = [NodeCache(tmp_path, 10 << 20, ds.manifest.fingerprint) for _ in range(2)]
    joins = [
        start(lambda c=c, r=r: c.fetch(ds.location, r)) for c, r in zip(caches, (a, b), strict=True)
    ]
    assert [join()[1] for join in joins] == [True, True]  # both copied in
    assert caches[0].entries() == sorted([a.path, b.path])
    assert [c.counters.misses for c in caches] == [1, 1]
    assert caches[0].usage() == a.bytes + b.bytes
    assert leftovers(tmp_path) == []


def test_copies_in_flight_count_toward_the_budget(ds, tmp_path, monkeypatch):
    a, b, c = ds.shards[:3]
    budget = a.bytes + b.bytes + c.bytes // 2
    in_flight = threading.Barrier(3, timeout=WAIT)  # the two copiers and this test
    go = threading.Event()
    gate_copies(monkeypatch, lambda: (in_flight.wait(), go.wait(WAIT)))
    pins = [a.path, b.path]
    cache = NodeCache(tmp_path, budget, ds.manifest.fingerprint, pinned=pins)
    joins = [start(lambda r=r: cache.fetch(ds.location, r)) for r in (a, b)]
    try:
        in_flight.wait()
        # nothing copied yet, both claimed: the claims are what the budget sees
        assert bytes_on_disk(tmp_path) == 0
        assert cache.usage() == a.bytes + b.bytes
        # two pinned shards on the way: a third can never fit, and is declined at once
        third = NodeCache(tmp_path, budget, ds.manifest.fingerprint, pinned=pins)
        assert third.fetch(ds.location, c) is None
        assert third.counters.declined == 1 and third.counters.evicted == 0
    finally:
        go.set()
    assert [join()[1] for join in joins] == [True, True]
    assert cache.entries("pinned") == sorted(pins)
    assert cache.usage() == bytes_on_disk(tmp_path) == a.bytes + b.bytes <= budget
    assert leftovers(tmp_path) == []


def test_a_shard_that_fits_once_copies_land_waits_for_them(ds, tmp_path, monkeypatch):
    a, b, c = ds.shards[:3]
    budget = a.bytes + b.bytes + c.bytes // 2
    in_flight = threading.Barrier(3, timeout=WAIT)
    go = threading.Event()
    copied = gate_copies(monkeypatch, lambda: len(copied) > 2 or (in_flight.wait(), go.wait(WAIT)))
    cache = NodeCache(tmp_path, budget, ds.manifest.fingerprint)
    joins = [start(lambda r=r: cache.fetch(ds.location, r)) for r in (a, b)]
    try:
        in_flight.wait()
        # c fits only once a or b has landed and is evicted: it waits, claiming nothing
        third = NodeCache(tmp_path, budget, ds.manifest.fingerprint)
        join_third = start(lambda: third.fetch(ds.location, c))
        time.sleep(0.3)
        assert cache.usage() == bytes_on_disk(tmp_path) + a.bytes + b.bytes == a.bytes + b.bytes
    finally:
        go.set()
    assert [join()[1] for join in joins] == [True, True]
    assert join_third()[1] is True
    assert copied == [a.path, b.path, c.path] or copied == [b.path, a.path, c.path]
    assert third.counters.evicted >= 1 and third.counters.declined == 0
    assert c.path in third.entries("lru")
    assert cache.usage() == bytes_on_disk(tmp_path) <= budget
    assert leftovers(tmp_path) == []


def test_the_budget_holds_under_many_loaders_at_once(ds, tmp_path, monkeypatch):
    shards = ds.shards
    budget = sum(sorted(s.bytes for s in shards)[-3:])
    gate_copies(monkeypatch, lambda: time.sleep(0.01))
    caches = [NodeCache(tmp_path, budget, ds.manifest.fingerprint) for _ in range(4)]
    orders = [random.Random(seed).choices(shards, k=12) for seed in range(4)]
    seen: list[int] = []
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            seen.append(bytes_on_disk(tmp_path))

    watcher = start(watch)
    joins = [
        start(lambda c=c, o=o: [c.fetch(ds.location, r) for r in o])
        for c, o in zip(caches, orders, strict=True)
    ]
    try:
        results = [join() for join in joins]
    finally:
        done.set()
        watcher()
    assert all(r is not None for rs in results for r in rs)  # every shard fits alone
    assert seen and max(seen) <= budget
    assert caches[0].usage() == bytes_on_disk(tmp_path) <= budget
    assert sum(c.counters.evicted for c in caches) > 0
    assert leftovers(tmp_path) == []


def test_a_second_loader_waits_for_the_copy_in_flight(ds, tmp_path, monkeypatch):
    a = ds.shards[0]
    copying, go = threading.Event(), threading.Event()
    copied = gate_copies(monkeypatch, lambda: (copying.set(), go.wait(WAIT)))
    first, second = (NodeCache(tmp_path, 10 << 20, ds.manifest.fingerprint) for _ in range(2))
    join_first = start(lambda: first.fetch(ds.location, a))
    assert copying.wait(WAIT)
    join_second = start(lambda: second.fetch(ds.location, a))
    time.sleep(0.3)
    go.set()
    assert join_first()[1] is True and join_second()[1] is False  # copied once, then a hit
    assert copied == [a.path]
    assert (first.counters.misses, second.counters.hits) == (1, 1)


CHILD = """
import os, sys, time
from shardfeed.formats import node_cache
from shardfeed.formats.atomic import temp_name
from shardfeed.formats.reader import open_dataset

root, ds_path, budget, ready = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
ds = open_dataset(ds_path)

def stuck(source, target, rel, size, sha256, **kwargs):  # half the bytes, then hang
    path = target.path(rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(temp_name(path), "wb") as out:
        out.write(b"x" * (size // 2))
    open(ready, "w").close()
    time.sleep(600)

node_cache.copy_file = stuck
node_cache.NodeCache(root, budget, ds.manifest.fingerprint).fetch(ds.location, ds.shards[0])
"""


def test_a_killed_copiers_claim_is_cleared(ds, tmp_path):
    a, b, c = ds.shards[:3]
    root, ready = tmp_path / "cache", tmp_path / "ready"
    budget = b.bytes + max(a.bytes, c.bytes)  # a + b fit, b + c fit, a + b + c do not
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(root), str(ds.location.display), str(budget), str(ready)]
    )
    try:
        deadline = time.monotonic() + 30
        while not ready.exists():
            assert child.poll() is None and time.monotonic() < deadline, "the copier never started"
            time.sleep(0.02)
        cache = NodeCache(root, budget, ds.manifest.fingerprint)
        assert cache.usage() == a.bytes  # its claim, not the half it wrote
        assert start(lambda: cache.fetch(ds.location, b))()[1] is True  # copies beside it
        assert cache.usage() == a.bytes + b.bytes
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert len(leftovers(root)) == 2  # the dead copier's claim and staging directory
    # c fits beside b only if the dead claim no longer counts: nothing is evicted for it
    assert cache.fetch(ds.location, c)[1] is True
    assert cache.counters.evicted == 0
    assert cache.entries() == sorted([b.path, c.path])
    assert leftovers(root) == []
    assert cache.usage() == bytes_on_disk(root) == b.bytes + c.bytes
