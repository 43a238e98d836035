"""``shardfeed.torch.ShardIterableDataset`` under a real ``torch.utils.data.DataLoader``.

Run by ``scripts/test_lerobot_interop.sh`` inside ``.venv-lerobot`` (CPU torch 2.13), after
``lerobot_load.py``. Like that file it is self-contained: the main suite never collects it (its
name does not match ``test_*.py``) and ``tests/interop`` has no ``conftest.py``.

A dataset of 2,003 samples (several shards and row groups; an encoded ``image``, an int64 ``id``
equal to the row's global index, a float32 ``(3,)`` tensor, a float64 scalar and a string) is
read by two simulated DDP ranks (two dataset objects, ``rank=0`` and ``rank=1`` of 2), each under
``DataLoader(batch_size=None, num_workers=2)``. The checks:

- each rank yields exactly the ids of its assignment spans (``plan_assignment(path, World(2, 1,
  2), mode="pad", ...)``), in the DataLoader's round-robin order (worker 0's first batch, then
  worker 1's, ...), and every value matches the reader's ``take``;
- together the ranks cover every sample; the repeats are exactly the plan's ``padded`` count;
- ``set_epoch`` reaches persistent workers; ``num_workers=0`` reads the rank's whole share;
- types: tensors for numbers, ``bytes`` for images, ``str`` for strings;
- rank and world default to an initialised ``torch.distributed`` group, else rank 0 of 1.
"""

from __future__ import annotations

import collections
import io
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
from PIL import Image
from torch.utils.data import DataLoader

from shardfeed import open_dataset, write_dataset
from shardfeed.assignment import World, plan_assignment
from shardfeed.torch import ShardIterableDataset, distributed_rank

N = 2003
BATCH = 16
SEED = 7
WORKERS = 2
FEATURES = {
    "image": {"dtype": "image", "shape": [4, 4, 3], "names": ["height", "width", "channel"]},
    "id": {"dtype": "int64", "shape": [1], "names": None},
    "state": {"dtype": "float32", "shape": [3], "names": None},
    "reward": {"dtype": "float64", "shape": [1], "names": None},
    "caption": {"dtype": "string", "shape": [1], "names": None},
}


def _png(i: int) -> bytes:
    pixels = np.full((4, 4, 3), i % 251, dtype=np.uint8)
    pixels[0, 0] = (i >> 8) % 256
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("torch-adapter") / "ds"
    rng = np.random.default_rng(0)
    write_dataset(
        root,
        FEATURES,
        {
            "image": [_png(i) for i in range(N)],
            "id": np.arange(N, dtype=np.int64),
            "state": rng.normal(size=(N, 3)).astype(np.float32),
            "reward": rng.normal(size=N),
            "caption": [f"sample {i}" for i in range(N)],
        },
        target_shard_size="40KB",
        row_group_size="8KB",
    )
    with open_dataset(root) as ds:
        assert len(ds.shards) >= 4, "the test wants several shards"
        assert any(len(s.row_groups) > 1 for s in ds.shards), "and several row groups per shard"
    return root


def expected_batches(path: Path, rank: int, workers: int, epoch: int) -> list[np.ndarray]:
    """The rank's batches of ids in DataLoader order: each worker's stream (its assignment
    spans, cut every BATCH rows), interleaved round robin, worker 0 first."""
    plan = plan_assignment(
        path, World(2, 1, workers), epochs=epoch + 1, seed=SEED, batch_size=BATCH, mode="pad"
    )
    with open_dataset(path) as ds:
        offsets = np.array([s.index_start for s in ds.shards])
    streams = []
    for worker in range(workers):
        spans = plan.spans(rank, worker, epoch)
        ids = np.concatenate(
            [np.arange(offsets[s] + a, offsets[s] + b) for s, a, b in _spans(spans)]
            or [np.zeros(0, dtype=np.int64)]
        )
        streams.append([ids[k : k + BATCH] for k in range(0, len(ids), BATCH)])
    order = []
    for turn in range(max(len(s) for s in streams)):
        order.extend(s[turn] for s in streams if turn < len(s))
    return order


def _spans(spans) -> list[tuple[int, int, int]]:
    return list(zip(spans.shard.tolist(), spans.start.tolist(), spans.end.tolist(), strict=True))


def padded(path: Path, workers: int, epoch: int) -> int:
    plan = plan_assignment(
        path, World(2, 1, workers), epochs=epoch + 1, seed=SEED, batch_size=BATCH, mode="pad"
    )
    return plan.epoch_plan(epoch).padded


def run(ds: ShardIterableDataset, **loader_args) -> list[dict]:
    return list(DataLoader(ds, batch_size=None, **loader_args))


def check_values(path: Path, batches: list[dict]) -> None:
    """Every value of every batch equals the reader's for that id."""
    with open_dataset(path) as reader:
        for batch in batches:
            ids = batch["id"].numpy()
            want = reader.take(ids.tolist())
            assert np.array_equal(want["id"], ids)
            np.testing.assert_array_equal(batch["state"].numpy(), want["state"])
            np.testing.assert_array_equal(batch["reward"].numpy(), want["reward"])
            assert list(batch["caption"]) == list(want["caption"])
            assert [bytes(v) for v in want["image"]] == list(batch["image"])


def test_two_ranks_two_workers_read_their_spans_round_robin(dataset):
    seen = collections.Counter()
    for rank in range(2):
        ds = ShardIterableDataset(dataset, rank=rank, world=2, batch_size=BATCH, seed=SEED)
        batches = run(ds, num_workers=WORKERS)
        want = expected_batches(dataset, rank, WORKERS, epoch=0)
        got = [b["id"].numpy() for b in batches]
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            assert np.array_equal(g, w)
        check_values(dataset, batches)
        seen.update(np.concatenate(got).tolist())
    assert set(seen) == set(range(N)), "every sample is read by some rank"
    repeats = sum(seen.values()) - N
    assert repeats == padded(dataset, WORKERS, 0)
    assert repeats < 2 * BATCH
    assert sum(seen.values()) % (2 * BATCH) == 0, "pad: every rank gets whole batches"


def test_same_multiset_as_the_loaders_own_streams(dataset):
    """The ids a rank yields are the union of ShardLoader(worker=w).streams[0].spans."""
    for rank in range(2):
        ds = ShardIterableDataset(dataset, rank=rank, world=2, batch_size=BATCH, seed=SEED)
        got = collections.Counter(
            np.concatenate([b["id"].numpy() for b in run(ds, num_workers=WORKERS)]).tolist()
        )
        want = collections.Counter()
        for worker in range(WORKERS):
            with ds.loader(worker, WORKERS) as loader:
                stream = loader.streams[0]
                offsets = np.array([s.index_start for s in stream.dataset.shards])
                for s, a, b in _spans(stream.spans):
                    want.update(range(offsets[s] + a, offsets[s] + b))
        assert got == want


def test_set_epoch_reaches_persistent_workers(dataset):
    ds = ShardIterableDataset(dataset, rank=1, world=2, batch_size=BATCH, seed=SEED)
    loader = DataLoader(ds, batch_size=None, num_workers=WORKERS, persistent_workers=True)
    for epoch in (0, 1, 2):
        ds.set_epoch(epoch)
        got = [b["id"].numpy() for b in loader]
        want = expected_batches(dataset, 1, WORKERS, epoch)
        assert len(got) == len(want)
        assert all(np.array_equal(g, w) for g, w in zip(got, want, strict=True)), epoch
    first = np.concatenate(expected_batches(dataset, 1, WORKERS, 0))
    later = np.concatenate(expected_batches(dataset, 1, WORKERS, 1))
    assert not np.array_equal(first, later), "epochs are reshuffled"


def test_in_process_reads_the_whole_share(dataset):
    ds = ShardIterableDataset(dataset, rank=0, world=2, batch_size=BATCH, seed=SEED, epoch=1)
    batches = run(ds, num_workers=0)
    want = expected_batches(dataset, 0, 1, epoch=1)
    assert [b["id"].tolist() for b in batches] == [w.tolist() for w in want]
    batch = batches[0]
    batch["state"].add_(1.0)  # the in-process copy is writable and owned
    check_values(dataset, batches[1:])


def test_batch_types(dataset):
    ds = ShardIterableDataset(dataset, rank=0, world=2, batch_size=BATCH, seed=SEED)
    for batch in (run(ds, num_workers=0)[0], run(ds, num_workers=WORKERS)[0]):
        assert isinstance(batch["id"], torch.Tensor) and batch["id"].dtype == torch.int64
        assert batch["state"].dtype == torch.float32 and batch["state"].shape == (BATCH, 3)
        assert batch["reward"].dtype == torch.float64 and batch["reward"].shape == (BATCH,)
        assert isinstance(batch["image"], np.ndarray) and batch["image"].dtype == object
        assert all(isinstance(v, bytes) for v in batch["image"])
        assert Image.open(io.BytesIO(batch["image"][0])).size == (4, 4)
        assert all(isinstance(v, str) for v in batch["caption"])


def test_decoded_images_are_uint8_tensors(dataset):
    ds = ShardIterableDataset(
        dataset, rank=0, world=2, batch_size=BATCH, seed=SEED, decode_images=True
    )
    batch = run(ds, num_workers=WORKERS)[0]
    assert batch["image"].dtype == torch.uint8 and batch["image"].shape == (BATCH, 4, 4, 3)
    ids = batch["id"].numpy()
    assert (batch["image"][:, 1, 1, 0].numpy() == ids % 251).all()


def test_rank_and_world_from_torch_distributed(dataset, tmp_path, monkeypatch):
    assert distributed_rank() == (0, 1)  # no process group: rank 0 of 1
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        ds = ShardIterableDataset(dataset, batch_size=BATCH, seed=SEED)
        assert (ds.rank, ds.world) == (0, 1)
        ids = np.concatenate([b["id"].numpy() for b in run(ds, num_workers=WORKERS)])
        assert set(ids.tolist()) == set(range(N)) and len(ids) % BATCH == 0
    finally:
        dist.destroy_process_group()


def test_rank_without_world_is_refused(dataset):
    with pytest.raises(ValueError, match="rank and world go together"):
        ShardIterableDataset(dataset, rank=0, batch_size=BATCH)
