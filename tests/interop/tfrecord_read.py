"""Real TensorFlow reads shardfeed's TFRecord output (``--format tfrecord``, FORMAT.md §16).

Run by ``scripts/test_tf_interop.sh`` in ``.venv-tf``. Self-contained (no main ``conftest.py``).
Three corpora go through shardfeed's own source readers (an image folder of real JPEG/PNG files,
JSONL text, and a LeRobot robot dataset: the real one under ``SHARDFEED_CORPORA`` when set, else a
generated episodic one) and ``write_dataset(encoding=...)``, plain and GZIP. Then:

- ``tf.data.TFRecordDataset`` + ``tf.io.parse_example`` with the spec FORMAT.md documents gives
  back every sample, equal to shardfeed's reader (float64 as float32: Examples have no doubles);
- ``shardfeed.tf.tf_dataset`` on a TFRecord dataset reads through TensorFlow (route ``tfrecord``)
  and rank ``r`` of ``w`` gets exactly that rank's share, as ``ShardLoader`` does.
"""

from __future__ import annotations

import functools
import io
import json
import os
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from shardfeed import open_dataset, write_dataset
from shardfeed.formats.sources import open_source
from shardfeed.loader import ShardLoader
from shardfeed.tf import TFRECORD, column_routes, parse_spec, tf_dataset

CORPORA = os.environ.get("SHARDFEED_CORPORA")
COMPRESSIONS = {"tfrecord": "", "tfrecord-gzip": "GZIP"}


def image_folder(root: Path) -> Path:
    rng = np.random.default_rng(0)
    for label in ("cat", "dog", "owl"):
        (root / label).mkdir(parents=True)
        for i in range(25):
            out = io.BytesIO()
            pixels = rng.integers(0, 255, (12 + i % 5, 16, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(out, format="JPEG" if i % 2 else "PNG")
            (root / label / f"{i:03d}.{'jpg' if i % 2 else 'png'}").write_bytes(out.getvalue())
    return root


def jsonl(root: Path) -> Path:
    root.mkdir(parents=True)
    rng = np.random.default_rng(1)
    with open(root / "part-0.jsonl", "w", encoding="utf-8") as handle:
        for i in range(200):
            row = {"text": f"doc {i} " + "é" * int(rng.integers(1, 40)), "score": float(i) / 7}
            handle.write(json.dumps(row) + "\n")
    return root


def robot(root: Path) -> tuple[Path, str]:
    """The real LeRobot v3.0 corpus when available (videos dropped), else a generated one."""
    if CORPORA:
        return Path(CORPORA, "lerobot_v30_reachy2_apple_storage"), "lerobot"
    spec = {
        "observation.state": {"dtype": "float32", "shape": [8]},
        "action": {"dtype": "float32", "shape": [8]},
        "timestamp": {"dtype": "float32", "shape": [1]},
        "episode_index": {"dtype": "int64", "shape": [1]},
        "frame_index": {"dtype": "int64", "shape": [1]},
        "index": {"dtype": "int64", "shape": [1]},
    }
    rng = np.random.default_rng(2)
    episodes = np.repeat(np.arange(6), 40)
    frames = np.tile(np.arange(40), 6)
    data = {
        "observation.state": rng.normal(size=(240, 8)).astype(np.float32),
        "action": rng.normal(size=(240, 8)).astype(np.float32),
        "timestamp": (frames / 30).astype(np.float32),
        "episode_index": episodes,
        "frame_index": frames,
        "index": np.arange(240),
    }
    return root, spec, data


def through_source(src: Path, kind: str, dst: Path, encoding: str) -> Path:
    """Read a raw corpus with shardfeed's source reader and write it as ``encoding``."""
    options = {"drop_videos": True} if kind == "lerobot" else {}
    source = open_source(str(src), kind, **options)
    inferred = None
    if hasattr(source, "infer"):
        from shardfeed.formats.sources.jsonl import merge_inferred

        inferred = functools.reduce(merge_inferred, [source.infer(f) for f in source.files()])
    spec = source.spec(inferred)
    units = [u for f in source.files() for u in source.scan(f, spec).units]
    assert units, f"{src}: no units"
    meta = source.meta()
    write_dataset(
        dst,
        spec,
        source.read(units, spec),
        target_shard_size="40KB",
        row_group_size="8KB",
        encoding=encoding,
        tasks=meta.tasks,
        fps=meta.fps,
    )
    return dst


@pytest.fixture(scope="module", params=sorted(COMPRESSIONS))
def corpora(request, tmp_path_factory) -> list[Path]:
    encoding = request.param
    base = tmp_path_factory.mktemp(encoding)
    out = [
        through_source(image_folder(base / "images"), "imagefolder", base / "images-ds", encoding),
        through_source(jsonl(base / "jsonl"), "jsonl", base / "jsonl-ds", encoding),
    ]
    made = robot(base / "robot")
    if len(made) == 2:
        out.append(through_source(made[0], made[1], base / "robot-ds", encoding))
    else:
        root, spec, data = made
        write_dataset(root, spec, data, target_shard_size="8KB", encoding=encoding)
        out.append(root)
    return out


def equal(tf_values: np.ndarray, ours: np.ndarray, dtype: str) -> None:
    if ours.dtype == object:  # strings and encoded images
        expected = [v.encode() if isinstance(v, str) else bytes(v) for v in ours]
        assert list(tf_values) == expected
    elif dtype == "float64":
        np.testing.assert_array_equal(tf_values, ours.astype(np.float32).reshape(len(ours), -1))
    else:
        np.testing.assert_array_equal(tf_values.reshape(ours.shape), ours)


def test_tensorflow_parses_every_record(corpora):
    for root in corpora:
        ds = open_dataset(root)
        assert ds.manifest.encoding in COMPRESSIONS
        expected = ds.read(0, len(ds))
        spec = parse_spec(ds)
        files = [str(root / s.path) for s in ds.shards]  # manifest order: global index order
        records = tf.data.TFRecordDataset(
            files, compression_type=COMPRESSIONS[ds.manifest.encoding]
        )
        parsed = {name: [] for name in spec}
        for batch in records.batch(64).map(lambda b, spec=spec: tf.io.parse_example(b, spec)):
            for name in spec:
                parsed[name].append(batch[name].numpy())
        for name, parts in parsed.items():
            equal(np.concatenate(parts), expected[name], ds.features[name].dtype)
        assert sum(len(p) for p in parsed[next(iter(spec))]) == len(ds)


def test_the_documented_hand_written_spec_parses_too(corpora):
    images = open_dataset(corpora[0])
    spec = {
        "image": tf.io.FixedLenFeature([], tf.string),
        "label": tf.io.FixedLenFeature([1], tf.int64),
    }
    files = [str(corpora[0] / s.path) for s in images.shards]
    kind = COMPRESSIONS[images.manifest.encoding]
    first = next(iter(tf.data.TFRecordDataset(files, compression_type=kind).batch(8)))
    parsed = tf.io.parse_example(first, spec)
    expected = images.read(0, 8)
    assert [bytes(v) for v in expected["image"]] == list(parsed["image"].numpy())
    decoded = tf.io.decode_image(parsed["image"][0])
    assert decoded.shape[-1] == 3


@pytest.mark.parametrize("rank", [0, 1, 2])
def test_tf_dataset_reads_a_ranks_share_through_tensorflow(corpora, rank):
    root = corpora[-1]  # the robot corpus: tensors, scalars, episodes
    ds = open_dataset(root)
    assert set(column_routes(ds).values()) == {TFRECORD}
    got = list(tf_dataset(root, rank=rank, world=3, batch_size=16, seed=3).as_numpy_iterator())
    want = list(ShardLoader(root, rank=rank, world=3, batch_size=16, seed=3))
    assert len(got) == len(want) > 0
    for a, b in zip(got, want, strict=True):
        assert a.keys() == b.keys()
        for name in a:
            equal(a[name], b[name], ds.features[name].dtype)
