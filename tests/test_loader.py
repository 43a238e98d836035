"""ShardLoader: exact delivery per the assignment, exact resume, the node cache, mixtures."""

from __future__ import annotations

import gc
import hashlib
import io
import threading
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from staging_fixtures import dataset

from shardfeed.assignment import World, assign, load_assignment, resume
from shardfeed.formats.dataset_writer import write_dataset
from shardfeed.formats.node_cache import NodeCache
from shardfeed.formats.reader import open_dataset
from shardfeed.hot import build_hot_index
from shardfeed.loader import ShardLoader


def ids_of(loader: ShardLoader) -> list[int]:
    out: list[int] = []
    for batch in loader:
        out.extend(batch["id"].tolist())
    return out


def span_ids(spans) -> list[int]:
    return [
        int(i)
        for s, a, b in zip(spans.shard, spans.start, spans.end, strict=True)
        for i in range(a, b)
    ]


@pytest.fixture(scope="module")
def ds(tmp_path_factory) -> Path:
    return dataset(tmp_path_factory.mktemp("loader") / "ds", n=600, size=1500)


def global_ids(path: Path, spans) -> list[int]:
    starts = [s.index_start for s in open_dataset(path).shards]
    return [
        starts[s] + r
        for s, a, b in zip(spans.shard, spans.start, spans.end, strict=True)
        for r in range(a, b)
    ]


def test_every_sample_once_per_the_stored_assignment(ds, tmp_path):
    world = World(2, 1, 2)
    assignment = assign(ds, world, name="t", batch_size=16, seed=3, mode="drop", overwrite=True)
    delivered = Counter()
    for rank in range(2):
        for worker in range(2):
            loader = ShardLoader(
                ds,
                rank=rank,
                world=world,
                worker=worker,
                num_workers=2,
                batch_size=16,
                assignment="t",
                seed=3,
            )
            got = ids_of(loader)
            assert got == global_ids(ds, assignment.spans(rank, worker, 0))  # order too
            assert all(n == 16 for n in map(len, _batches(loader)))
            delivered.update(got)
    assert max(delivered.values()) == 1  # drop: nothing twice
    assert sum(delivered.values()) == 600 - assignment.header.counts(0).dropped


def _batches(loader: ShardLoader) -> list[np.ndarray]:
    return [b["id"] for b in loader]


def test_in_memory_plan_covers_the_epoch_with_counted_padding(ds):
    delivered = Counter()
    for rank in range(3):
        delivered.update(ids_of(ShardLoader(ds, rank=rank, world=3, batch_size=32, epoch=1)))
    assert set(delivered) == set(range(600))
    assert sum(delivered.values()) == 3 * 7 * 32  # pad: every rank gets whole batches
    # a different epoch reads the same samples in another order
    again = ids_of(ShardLoader(ds, rank=0, world=3, batch_size=32, epoch=2))
    first = ids_of(ShardLoader(ds, rank=0, world=3, batch_size=32, epoch=1))
    assert again != first


def test_batches_match_the_reader(ds):
    reader = open_dataset(ds)
    for batch in ShardLoader(ds, rank=1, world=2, batch_size=50, prefetch=2):
        ids = batch["id"]
        expected = reader.take(ids)
        assert [bytes(v) for v in batch["blob"]] == list(expected["blob"])
        assert batch["id"].dtype == np.int64 and batch["id"].shape == (len(ids),)


def test_resume_after_n_batches_continues_exactly(ds):
    whole = [b["id"].copy() for b in ShardLoader(ds, rank=0, world=2, batch_size=20, seed=7)]
    first = ShardLoader(ds, rank=0, world=2, batch_size=20, seed=7)
    it = iter(first)
    for _ in range(4):
        next(it)
    state = first.state_dict()
    first.close()
    assert state["batches"] == 4 and state["samples"] == 80
    second = ShardLoader(ds, rank=0, world=2, batch_size=20, seed=7)
    second.load_state_dict(state)
    rest = [b["id"].copy() for b in second]
    assert len(rest) == len(whole) - 4
    for a, b in zip(rest, whole[4:], strict=True):
        np.testing.assert_array_equal(a, b)
    other = ShardLoader(ds, rank=1, world=2, batch_size=20, seed=7)
    with pytest.raises(ValueError, match="rank"):
        other.load_state_dict(state)
    # a state from another planner's in-memory plan would resume a different order
    older = {k: v for k, v in state.items() if k != "planner"}
    with pytest.raises(ValueError, match="planner"):
        second.load_state_dict(older)


def test_elastic_resume_through_the_assignment_api(ds):
    world = World(2, 1, 1)
    assignment = assign(ds, world, name="el", batch_size=10, overwrite=True)
    seen = Counter()
    loaders = [
        ShardLoader(ds, rank=r, world=world, batch_size=10, assignment="el") for r in range(2)
    ]
    iters = [iter(loader) for loader in loaders]
    for _ in range(5):  # 5 steps in lockstep
        for it in iters:
            seen.update(next(it)["id"].tolist())
    consumed = sum(loader.samples_seen for loader in loaders)
    rest = resume(load_assignment(ds, "el"), 0, consumed, World(3, 1, 1)).save()
    for rank in range(3):
        seen.update(ids_of(ShardLoader(ds, rank=rank, world=3, batch_size=10, assignment=rest)))
    assert set(seen) == set(range(600))
    assert (
        sum(seen.values()) - 600
        <= assignment.header.counts(0).padded + rest.header.counts(0).padded
    )


def test_node_cache_stays_in_budget_pins_hot_and_leaves_the_source_alone(ds, tmp_path):
    manifest = open_dataset(ds).manifest
    sizes = {s.path: s.bytes for s in manifest.shards}
    before = {p: hashlib.sha256((ds / p).read_bytes()).hexdigest() for p in sizes}
    log = tmp_path / "access.txt"
    hot_rows = range(manifest.shards[5].index_start, manifest.shards[5].index_start + 20)
    log.write_text("".join(f"{i}\n" for i in hot_rows))
    build_hot_index(ds, access_log=str(log)).save()
    budget = int(sorted(sizes.values())[-1] * 2.5)
    cache_dir = tmp_path / "cache"
    loader = ShardLoader(
        ds, rank=0, world=1, batch_size=25, cache_dir=cache_dir, cache_bytes=budget
    )
    cache = loader.caches[0]
    assert cache.pinned == {manifest.shards[5].path}
    for _ in loader:
        assert cache.usage() <= budget
    assert manifest.shards[5].path in cache.entries("pinned")
    assert cache.counters.evicted > 0 and cache.counters.misses > 0
    second = ShardLoader(
        ds, rank=0, world=1, batch_size=25, cache_dir=cache_dir, cache_bytes=budget
    )
    list(second)
    assert second.metrics()["cache_hit_ratio"] > 0
    assert cache.usage() <= budget
    after = {p: hashlib.sha256((ds / p).read_bytes()).hexdigest() for p in sizes}
    assert after == before
    (ds / "meta/shardfeed/hot_index.json").unlink()
    (ds / "meta/shardfeed/hot_index.parquet").unlink()


def test_node_cache_evicts_least_recently_used_and_declines_what_cannot_fit(ds, tmp_path):
    reader = open_dataset(ds)
    shards = reader.shards
    budget = shards[0].bytes + shards[1].bytes + shards[2].bytes // 2
    cache = NodeCache(tmp_path / "c", budget, reader.manifest.fingerprint, pinned=[shards[2].path])
    assert cache.fetch(reader.location, shards[0])[1]  # copied in
    assert cache.fetch(reader.location, shards[1])[1]
    assert not cache.fetch(reader.location, shards[0])[1]  # a hit: 0 is now newer than 1
    assert cache.fetch(reader.location, shards[3])[1]  # evicts 1, the LRU one
    assert cache.entries("lru") == sorted([shards[0].path, shards[3].path])
    assert cache.usage() <= budget
    big = NodeCache(tmp_path / "d", shards[0].bytes - 1, reader.manifest.fingerprint)
    assert big.fetch(reader.location, shards[0]) is None  # never fits: read through
    assert big.counters.declined == 1


def test_a_corrupt_cache_copy_is_dropped_and_read_again(ds, tmp_path):
    cache_dir = tmp_path / "cache"
    budget = 10 << 20
    reference = [b["id"].copy() for b in ShardLoader(ds, rank=0, world=1, batch_size=40)]
    list(ShardLoader(ds, rank=0, world=1, batch_size=40, cache_dir=cache_dir, cache_bytes=budget))
    copy = next((cache_dir).rglob("*.parquet"))
    data = bytearray(copy.read_bytes())
    data[200] ^= 0xFF  # inside the first data page: its page checksum fails
    copy.write_bytes(bytes(data))
    again = ShardLoader(ds, rank=0, world=1, batch_size=40, cache_dir=cache_dir, cache_bytes=budget)
    for a, b in zip((b["id"] for b in again), reference, strict=True):
        np.testing.assert_array_equal(a, b)


def test_mixture_honours_weights_over_windows_and_resumes(tmp_path):
    web = dataset(tmp_path / "web", n=800, size=800)
    code = dataset(tmp_path / "code", n=400, size=800)
    loader = ShardLoader({web: 0.7, code: 0.3}, rank=0, world=1, batch_size=10)
    sources, _ = loader._schedule
    window = 20
    for i in range(len(sources) - window):
        share = (sources[i : i + window] == 0).sum()
        assert abs(share - 0.7 * window) <= 2
    full = [b["id"].copy() for b in loader]
    assert len(full) == len(loader)
    again = ShardLoader([(web, 0.7), (code, 0.3)], rank=0, world=1, batch_size=10)
    it = iter(again)
    for _ in range(7):
        next(it)
    state = again.state_dict()
    resumed = ShardLoader({web: 0.7, code: 0.3}, rank=0, world=1, batch_size=10)
    resumed.load_state_dict(state)
    for a, b in zip((b["id"] for b in resumed), full[7:], strict=True):
        np.testing.assert_array_equal(a, b)


def test_decode_images_gives_pillow_pixels(tmp_path):
    rng = np.random.default_rng(1)
    pixels = [rng.integers(0, 255, (12, 16, 3), dtype=np.uint8) for _ in range(40)]
    encoded = []
    for p in pixels:
        out = io.BytesIO()
        Image.fromarray(p).save(out, format="PNG")
        encoded.append(out.getvalue())
    spec = {
        "image": {"dtype": "image", "shape": [12, 16, 3]},
        "id": {"dtype": "int64", "shape": [1]},
    }
    write_dataset(tmp_path / "img", spec, {"image": encoded, "id": [[i] for i in range(40)]})
    for batch in ShardLoader(tmp_path / "img", rank=0, world=1, batch_size=8, decode_images=True):
        assert batch["image"].dtype == np.uint8 and batch["image"].shape == (8, 12, 16, 3)
        for ident, decoded in zip(batch["id"], batch["image"], strict=True):
            np.testing.assert_array_equal(decoded, pixels[ident])


def test_metrics_count_what_was_delivered(ds):
    loader = ShardLoader(ds, rank=0, world=1, batch_size=64)
    n = sum(len(b["id"]) for b in loader)
    m = loader.metrics()
    assert m["samples"] == n and m["batches"] == len(loader)
    assert m["bytes"] > 0 and m["samples_per_s"] > 0 and m["wait_s"] >= 0
    assert m["row_group_reads"] >= len(open_dataset(ds).shards)


def test_bad_arguments_are_clear(ds):
    with pytest.raises(ValueError, match="rank 2 is outside"):
        ShardLoader(ds, rank=2, world=2, batch_size=4)
    with pytest.raises(ValueError, match="batch_size"):
        ShardLoader(ds, rank=0, world=1, batch_size=0)
    with pytest.raises(KeyError, match="does not store"):
        ShardLoader(ds, rank=0, world=1, batch_size=4, columns=["nope"])
    with pytest.raises(ValueError, match="cache_dir and cache_bytes"):
        ShardLoader(ds, rank=0, world=1, batch_size=4, cache_dir="/tmp/x")


def _pool_threads() -> list[threading.Thread]:
    """The loader's I/O threads still alive."""
    return [t for t in threading.enumerate() if t.name.startswith("shardfeed-io")]


def test_no_io_thread_outlives_its_pass(ds):
    """A pass stopped midway waits for its reads in flight, so none outlives it and the next
    pass starts clean; closing the loader leaves no thread behind."""
    gc.collect()  # an earlier test's unfinished iterator stops its pass when collected
    assert _pool_threads() == []
    loader = ShardLoader(ds, rank=0, world=1, batch_size=8, columns=["id"], io_threads=3)
    batches = iter(loader)
    next(batches), next(batches)
    assert len(_pool_threads()) >= 1  # the pass is running
    loader.set_epoch(1)  # stops it
    assert _pool_threads() == []
    assert sum(len(b["id"]) for b in loader) == loader.samples_seen > 0
    loader.close()
    assert _pool_threads() == []
