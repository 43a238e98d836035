"""TFRecord output (`convert --format tfrecord`): same plan and values as Parquet, offsets, verify."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from test_convert_pipeline import _jsonl_corpus, _tree

from shardfeed.cli.main import main
from shardfeed.formats.dataset_writer import write_dataset
from shardfeed.formats.errors import CorruptShardError
from shardfeed.formats.reader import open_dataset
from shardfeed.formats.sample_index import read_record_offsets
from shardfeed.formats.tfrecord import iter_records
from shardfeed.formats.verify import verify_dataset
from shardfeed.loader import ShardLoader

CORPORA = os.environ.get("SHARDFEED_CORPORA")
REPO = Path(__file__).resolve().parents[1]
ENCODINGS = ["none", "gzip"]


def convert(src: Path, dst: Path, *args: str) -> None:
    assert main(["convert", str(src), str(dst), *args]) == 0


def assert_same_values(a: Path, b: Path) -> None:
    """Both datasets hold the same rows in the same order (float64 as float32: TF has none)."""
    one, two = open_dataset(a), open_dataset(b)
    assert len(one) == len(two) and [s.rows for s in one.shards] == [s.rows for s in two.shards]
    x, y = one.read(0, len(one)), two.read(0, len(two))
    assert x.keys() == y.keys()
    for name in x:
        if one.features[name].dtype == "float64":
            np.testing.assert_array_equal(x[name].astype(np.float32), y[name].astype(np.float32))
        elif x[name].dtype == object:
            assert [
                None if v is None else bytes(v) if isinstance(v, (bytes, memoryview)) else v
                for v in x[name]
            ] == [
                None if v is None else bytes(v) if isinstance(v, (bytes, memoryview)) else v
                for v in y[name]
            ]
        else:
            np.testing.assert_array_equal(x[name], y[name])


@pytest.mark.parametrize("compression", ENCODINGS)
def test_image_folder_and_jsonl_match_their_parquet_conversion(tmp_path, compression):
    images = tmp_path / "images"
    subprocess.run(
        [
            sys.executable,
            str(REPO / "scripts/make_sample_corpus.py"),
            "--kind",
            "imagefolder-corpus",
            "--out",
            str(images),
            "--bad",
            "1",
        ],
        check=True,
        capture_output=True,
    )
    jsonl = _jsonl_corpus(tmp_path / "jsonl", n=300)
    for src, size in ((images, "120KB"), (jsonl, "40KB")):
        parquet, tfr = tmp_path / f"{src.name}-pq", tmp_path / f"{src.name}-tfr"
        convert(src, parquet, "--target-shard-size", size)
        convert(
            src,
            tfr,
            "--target-shard-size",
            size,
            "--format",
            "tfrecord",
            "--tfrecord-compression",
            compression,
        )
        assert_same_values(parquet, tfr)
        ds = open_dataset(tfr)
        suffix = ".tfrecord.gz" if compression == "gzip" else ".tfrecord"
        assert all(s.path.endswith(suffix) for s in ds.shards) and len(ds.shards) > 1
        assert ds.manifest.encoding == ("tfrecord-gzip" if compression == "gzip" else "tfrecord")
        assert verify_dataset(tfr).ok
        # the sample index holds every record's offset, as the file's framing has them
        offsets = read_record_offsets(tfr)
        for shard in ds.shards:
            found = [o for o, _ in iter_records(tfr / shard.path)]
            assert found == offsets[shard.index_start : shard.index_end].tolist()


@pytest.mark.skipif(not CORPORA, reason="SHARDFEED_CORPORA is not set (scripts/test.sh sets it)")
def test_robot_corpus_matches_its_parquet_conversion(tmp_path):
    src = Path(CORPORA, "lerobot_v21_unitree_g1")
    args = ["--target-shard-size", "60KB", "--drop-videos"]
    convert(src, tmp_path / "pq", *args)
    convert(src, tmp_path / "tfr", *args, "--format", "tfrecord")
    assert_same_values(tmp_path / "pq", tmp_path / "tfr")
    assert verify_dataset(tmp_path / "tfr").ok


def test_conversion_is_deterministic(tmp_path):
    src = _jsonl_corpus(tmp_path / "src", n=200)
    for name in ("a", "b"):
        convert(
            src,
            tmp_path / name,
            "--format",
            "tfrecord",
            "--tfrecord-compression",
            "gzip",
            "--target-shard-size",
            "30KB",
        )
    assert _tree(tmp_path / "a") == _tree(tmp_path / "b")


def every_dtype(tmp_path: Path, encoding: str) -> tuple[Path, dict]:
    rng = np.random.default_rng(4)
    n = 120
    spec = {
        "x": {"dtype": "float32", "shape": [2, 3]},
        "h": {"dtype": "float16", "shape": [1]},
        "u": {"dtype": "uint64", "shape": [1]},
        "b": {"dtype": "bool", "shape": [4]},
        "i8": {"dtype": "int8", "shape": [1]},
        "t": {"dtype": "string", "shape": [1]},
        "img": {"dtype": "image", "shape": [2, 2, 3]},
    }
    data = {
        "x": rng.normal(size=(n, 2, 3)).astype(np.float32),
        "h": rng.normal(size=n).astype(np.float16),
        "u": np.arange(n, dtype=np.uint64) * np.uint64(1 << 57),  # beyond int64 too
        "b": rng.integers(0, 2, (n, 4)).astype(bool),
        "i8": rng.integers(-128, 127, n).astype(np.int8),
        "t": [None if i % 5 == 0 else f"é{i}" for i in range(n)],
        "img": [None if i % 9 == 0 else rng.bytes(30 + i) for i in range(n)],
    }
    root = tmp_path / encoding
    write_dataset(root, spec, data, target_shard_size=2000, row_group_size=500, encoding=encoding)
    return root, data


@pytest.mark.parametrize("encoding", ["tfrecord", "tfrecord-gzip"])
def test_every_dtype_and_nulls_round_trip(tmp_path, encoding):
    root, data = every_dtype(tmp_path, encoding)
    ds = open_dataset(root)
    assert len(ds.shards) > 2 and max(len(s.row_groups) for s in ds.shards) > 1
    got = ds.read(0, len(ds))
    for name in ("x", "h", "u", "b", "i8"):
        np.testing.assert_array_equal(got[name], data[name])
    assert list(got["t"]) == data["t"]
    assert [None if v is None else bytes(v) for v in got["img"]] == data["img"]
    picked = ds.take([119, 3, 64, 3])  # random access through the record offsets
    np.testing.assert_array_equal(picked["x"], data["x"][[119, 3, 64, 3]])
    ids = []
    for batch in ShardLoader(root, rank=1, world=2, batch_size=16):
        ids.append(batch["i8"])
    assert sum(map(len, ids)) == 64  # pad: 4 whole batches of 16 for each of 2 ranks


def test_verify_catches_a_flipped_byte_by_hash_and_framing(tmp_path):
    root, _ = every_dtype(tmp_path, "tfrecord")
    shard = open_dataset(root).shards[1]
    path = root / shard.path
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    problems = verify_dataset(root).problems
    assert [p.kind for p in problems] == ["hash", "framing"]
    assert all(p.path == shard.path for p in problems) and "data crc" in problems[1].detail
    # a TFRecord shard has no footer to check, so the reader hashes it whole when it opens it
    with pytest.raises(CorruptShardError, match="sha256 does not match the manifest"):
        open_dataset(root).read(shard.index_start, shard.index_end)


def test_verify_reports_a_shard_cut_short_or_grown(tmp_path):
    root, _ = every_dtype(tmp_path, "tfrecord")
    shard = open_dataset(root).shards[0]
    path = root / shard.path
    path.write_bytes(path.read_bytes() + b"\0" * 20)
    problems = verify_dataset(root, check_hashes=False).problems
    assert [p.kind for p in problems] == ["size"]
    with pytest.raises(Exception, match="size"):
        open_dataset(root).read(0, 1)
