"""``shardfeed.tf.tf_dataset`` on TensorFlow 2.16 and tensorflow-io 0.37.1.

Run by ``scripts/test_tf_interop.sh`` inside ``.venv-tf`` (the ``[tf]`` extra: numpy < 2,
pyarrow < 18). Self-contained: the main suite never collects it (its name does not match
``test_*.py``) and ``tests/interop`` has no ``conftest.py``.

A dataset with one column of every kind the routes treat differently (scalars of several widths,
unsigned values past the signed range, a dotted name, strings, a string column with nulls, encoded
images, 1-D and 2-D tensors) is read for rank ``r`` of 3. The checks:

- the batches hold exactly the ids of the rank's assignment spans, in order, cut like
  ``ShardLoader``'s; every value of every column equals the reader's ``take``;
- the scalar, string and image columns really go through ``tfio.IODataset.from_parquet`` (a spy
  sees the calls), tensors and the nullable column through the generator;
- a dataset with a float16 feature (which crashes tensorflow-io) goes wholly through the
  generator and still reads right; workers split a rank's share; epochs differ.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_io as tfio
from PIL import Image

from shardfeed import open_dataset, write_dataset
from shardfeed.assignment import World, plan_assignment
from shardfeed.loader import ShardLoader
from shardfeed.tf import GENERATOR, PARQUET, column_routes, tf_dataset

N = 1500
BATCH = 24
SEED = 5
RANKS = 3
FEATURES = {
    "id": {"dtype": "int64", "shape": [1]},
    "small": {"dtype": "int8", "shape": [1]},
    "u16": {"dtype": "uint16", "shape": [1]},
    "u32": {"dtype": "uint32", "shape": [1]},
    "u64": {"dtype": "uint64", "shape": [1]},
    "flag": {"dtype": "bool", "shape": [1]},
    "observation.reward": {"dtype": "float32", "shape": [1]},
    "value": {"dtype": "float64", "shape": [1]},
    "caption": {"dtype": "string", "shape": [1]},
    "note": {"dtype": "string", "shape": [1]},  # every 7th is null
    "image": {"dtype": "image", "shape": [4, 4, 3]},
    "observation.state": {"dtype": "float32", "shape": [3]},
    "grid": {"dtype": "int64", "shape": [2, 2]},
}
EXPECTED_ROUTES = {
    **{name: PARQUET for name in FEATURES},
    "note": GENERATOR,
    "observation.state": GENERATOR,
    "grid": GENERATOR,
}


def _png(i: int) -> bytes:
    out = io.BytesIO()
    Image.fromarray(np.full((4, 4, 3), i % 251, dtype=np.uint8)).save(out, format="PNG")
    return out.getvalue()


def _columns(n: int) -> dict:
    rng = np.random.default_rng(1)
    i = np.arange(n)
    return {
        "id": i.astype(np.int64),
        "small": (i % 256 - 128).astype(np.int8),
        "u16": (i * 37 % 65536).astype(np.uint16),
        "u32": (2**32 - 1 - i).astype(np.uint32),
        "u64": (np.uint64(2**64 - 1) - i.astype(np.uint64)).astype(np.uint64),
        "flag": i % 3 == 0,
        "observation.reward": rng.normal(size=n).astype(np.float32),
        "value": rng.normal(size=n),
        "caption": [f"sample {k} é" for k in range(n)],
        "note": [None if k % 7 == 0 else f"n{k}" for k in range(n)],
        "image": [_png(k) for k in range(n)],
        "observation.state": rng.normal(size=(n, 3)).astype(np.float32),
        "grid": i.repeat(4).reshape(n, 2, 2) * np.array([[1, 2], [3, 4]]),
    }


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("tf-adapter") / "ds"
    write_dataset(root, FEATURES, _columns(N), target_shard_size="60KB", row_group_size="12KB")
    with open_dataset(root) as ds:
        assert len(ds.shards) >= 4 and any(len(s.row_groups) > 1 for s in ds.shards)
    return root


@pytest.fixture
def parquet_calls(monkeypatch) -> list[list[str]]:
    """The columns of every ``tfio.IODataset.from_parquet`` call."""
    calls: list[list[str]] = []
    real = tfio.IODataset.from_parquet

    def spy(filename, columns=None, **kwargs):
        calls.append(list(columns or []))
        return real(filename, columns=columns, **kwargs)

    monkeypatch.setattr(tfio.IODataset, "from_parquet", spy)
    return calls


def share(path: Path, rank: int, epoch: int = 0, workers: int = 1, worker: int = 0) -> np.ndarray:
    """The ids ``worker`` of ``rank`` reads, in order, by the assignment (pad policy)."""
    plan = plan_assignment(
        path,
        World(RANKS, 1, workers),
        epochs=epoch + 1,
        seed=SEED,
        batch_size=BATCH,
        mode="pad",
    )
    spans = plan.spans(rank, worker, epoch)
    with open_dataset(path) as ds:
        offsets = [s.index_start for s in ds.shards]
    return np.concatenate(
        [
            np.arange(offsets[s] + a, offsets[s] + b)
            for s, a, b in zip(
                spans.shard.tolist(), spans.start.tolist(), spans.end.tolist(), strict=True
            )
        ]
    )


def read(path: Path, **kwargs) -> list[dict[str, np.ndarray]]:
    args = {"world": RANKS, "seed": SEED, "batch_size": BATCH, **kwargs}
    return list(tf_dataset(path, **args).as_numpy_iterator())


def as_tf(values: np.ndarray, feature: dict) -> list:
    """The reader's values as tf.data gives them (strings and images as bytes, null as b"")."""
    if feature["dtype"] == "string":
        return [b"" if v is None else v.encode() for v in values]
    if feature["dtype"] == "image":
        return [bytes(v) for v in values]
    return values


def check_against_reader(path: Path, batches: list[dict[str, np.ndarray]]) -> None:
    with open_dataset(path) as reader:
        for batch in batches:
            want = reader.take(batch["id"].tolist())
            for name, got in batch.items():
                feature = reader.features[name].to_json()
                expected = as_tf(want[name], feature)
                if isinstance(expected, list):
                    assert list(got) == expected, name
                else:
                    assert got.dtype == expected.dtype, name
                    np.testing.assert_array_equal(got, expected, err_msg=name)


def test_routes(dataset):
    assert column_routes(dataset) == EXPECTED_ROUTES


@pytest.mark.parametrize("rank", range(RANKS))
def test_rank_reads_its_share_with_the_readers_values(dataset, rank, parquet_calls):
    batches = read(dataset, rank=rank)
    ids = np.concatenate([b["id"] for b in batches])
    np.testing.assert_array_equal(ids, share(dataset, rank))
    assert len(ids) % BATCH == 0, "pad: whole batches"
    assert [len(b["id"]) for b in batches] == [BATCH] * (len(ids) // BATCH)
    assert set(batches[0]) == set(FEATURES)
    check_against_reader(dataset, batches)
    # the parquet columns were read by tensorflow-io, the others were not
    asked = {c for call in parquet_calls for c in call}
    direct = {n for n, r in EXPECTED_ROUTES.items() if r == PARQUET}
    assert asked == (direct - {"image"}) | {"image.bytes"}


def test_same_batches_as_the_shard_loader(dataset):
    batches = read(dataset, rank=2, epoch=1, columns=["id", "caption", "grid"])
    with ShardLoader(dataset, rank=2, world=RANKS, epoch=1, seed=SEED, batch_size=BATCH) as loader:
        reference = list(loader)
    assert len(batches) == len(reference)
    for got, want in zip(batches, reference, strict=True):
        np.testing.assert_array_equal(got["id"], want["id"])
        np.testing.assert_array_equal(got["grid"], want["grid"])
        assert list(got["caption"]) == [c.encode() for c in want["caption"]]


def test_every_sample_is_read_once_but_the_padding(dataset):
    ids = np.concatenate(
        [b["id"] for r in range(RANKS) for b in read(dataset, rank=r, columns=["id", "grid"])]
    )
    assert set(ids.tolist()) == set(range(N))
    plan = plan_assignment(dataset, World(RANKS, 1, 1), seed=SEED, batch_size=BATCH, mode="pad")
    assert len(ids) - N == plan.epoch_plan(0).padded


def test_workers_split_the_rank(dataset):
    parts = [read(dataset, rank=1, worker=w, num_workers=2, columns=["id"]) for w in (0, 1)]
    for w, batches in enumerate(parts):
        ids = np.concatenate([b["id"] for b in batches])
        np.testing.assert_array_equal(ids, share(dataset, 1, workers=2, worker=w))
    both = np.concatenate([b["id"] for p in parts for b in p])
    one = np.concatenate([b["id"] for b in read(dataset, rank=1, columns=["id"])])
    assert sorted(both.tolist()) == sorted(one.tolist())


def test_epochs_differ_and_repeat(dataset):
    first = np.concatenate([b["id"] for b in read(dataset, rank=0, columns=["id", "caption"])])
    again = tf_dataset(
        dataset, rank=0, world=RANKS, seed=SEED, batch_size=BATCH, columns=["id", "grid"]
    )
    twice = [np.concatenate([b["id"] for b in again.as_numpy_iterator()]) for _ in range(2)]
    np.testing.assert_array_equal(twice[0], first)
    np.testing.assert_array_equal(twice[1], first)
    later = np.concatenate([b["id"] for b in read(dataset, rank=0, epoch=1, columns=["id"])])
    np.testing.assert_array_equal(later, share(dataset, 0, epoch=1))
    assert not np.array_equal(later, first)


def test_columns_pick_and_mix_routes(dataset):
    batches = read(dataset, rank=0, columns=["observation.state", "observation.reward"])
    assert set(batches[0]) == {"observation.state", "observation.reward"}
    assert batches[0]["observation.state"].shape == (BATCH, 3)
    assert batches[0]["observation.reward"].shape == (BATCH,)
    with pytest.raises(KeyError, match="does not store"):
        tf_dataset(dataset, rank=0, world=RANKS, batch_size=BATCH, columns=["nope"])


def test_decode_image_bytes(dataset):
    batch = read(dataset, rank=0, columns=["id", "image"])[0]
    pixels = tf.io.decode_image(batch["image"][0]).numpy()
    assert pixels.shape == (4, 4, 3) and (pixels == batch["id"][0] % 251).all()


def test_float16_dataset_goes_through_the_generator(tmp_path, parquet_calls):
    root = tmp_path / "half"
    features = {
        "id": {"dtype": "int64", "shape": [1]},
        "half": {"dtype": "float16", "shape": [1]},
        "caption": {"dtype": "string", "shape": [1]},
    }
    n = 300
    write_dataset(
        root,
        features,
        {
            "id": np.arange(n),
            "half": (np.arange(n) / 8).astype(np.float16),
            "caption": [f"c{k}" for k in range(n)],
        },
        target_shard_size="2KB",
    )
    assert set(column_routes(root).values()) == {GENERATOR}
    batches = read(root, rank=1)
    assert parquet_calls == []
    assert batches[0]["half"].dtype == np.float16
    check_against_reader(root, batches)
