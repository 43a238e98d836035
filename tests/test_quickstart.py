"""The quickstart path and the sample maker it uses (``scripts/make_sample_corpus.py``).

``scripts/quickstart.sh`` writes a raw image folder with the maker's ``imagefolder-corpus`` kind,
converts it with ``shardfeed convert`` and runs ``verify``, ``rejects`` and ``inspect``:
``test_quickstart_convert_path`` does the same, minus the venv. The maker's in-memory samples also
go through ``write_dataset`` here (the Python API path).
"""

from __future__ import annotations

import importlib.util
import io
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
from PIL import Image

from shardfeed import open_dataset, write_dataset
from shardfeed.cli.main import main as shardfeed_main
from shardfeed.schemas.manifest import MANIFEST_PATH

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "make_sample_corpus.py"
QUICKSTART = SCRIPT.with_name("quickstart.sh")


@pytest.fixture(scope="module")
def corpus() -> ModuleType:
    spec = importlib.util.spec_from_file_location("make_sample_corpus", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("make_sample_corpus", module)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def robot(corpus: ModuleType):
    return corpus.make_robot_samples(seed=0)


@pytest.fixture(scope="module")
def images(corpus: ModuleType):
    return corpus.make_image_samples(seed=0)


def _write_robot(corpus: ModuleType, robot, path: Path, **kwargs):
    features, data, tasks = robot
    return write_dataset(
        path,
        features,
        data,
        tasks=tasks,
        fps=corpus.ROBOT_FPS,
        robot_type=corpus.ROBOT_TYPE,
        target_shard_size="48KB",
        **kwargs,
    )


def _cli(*argv: str) -> tuple[int, str]:
    """Run the installed CLI as a user does; return its exit code and stdout."""
    result = subprocess.run(
        [sys.executable, "-m", "shardfeed.cli.main", *argv],
        capture_output=True,
        text=True,
        timeout=120,
    )
    return result.returncode, result.stdout


# -- the sample maker ------------------------------------------------------------------------------


def test_robot_samples_are_lerobot_shaped(corpus: ModuleType, robot) -> None:
    features, data, tasks = robot
    assert list(features) == [
        "observation.state",
        "action",
        "timestamp",
        "frame_index",
        "episode_index",
        "index",
        "task_index",
    ]
    assert set(data) == set(features)
    n = len(data["index"])
    assert data["observation.state"].shape == (n, 6)
    assert data["observation.state"].dtype == np.float32
    assert data["action"].shape == (n, 6)
    assert data["action"].dtype == np.float32
    assert data["timestamp"].dtype == np.float32
    for name in ("frame_index", "episode_index", "index", "task_index"):
        assert data[name].shape == (n,)
        assert data[name].dtype == np.int64
    np.testing.assert_array_equal(data["index"], np.arange(n))

    episodes = data["episode_index"]
    assert np.all(np.diff(episodes) >= 0), "episodes must be contiguous and in order"
    ids, starts, lengths = np.unique(episodes, return_index=True, return_counts=True)
    np.testing.assert_array_equal(ids, np.arange(20))
    assert lengths.min() >= 50
    assert lengths.max() <= 200
    assert len(set(lengths.tolist())) > 5, "episode lengths should vary"
    for start, length in zip(starts, lengths, strict=True):
        np.testing.assert_array_equal(
            data["frame_index"][start : start + length], np.arange(length)
        )
        assert len(set(data["task_index"][start : start + length].tolist())) == 1
    np.testing.assert_allclose(data["timestamp"], data["frame_index"] / corpus.ROBOT_FPS, rtol=1e-6)
    assert 2 <= len(tasks) <= 3
    assert sorted(set(data["task_index"].tolist())) == list(range(len(tasks)))
    assert np.isfinite(data["observation.state"]).all()


def test_samples_are_deterministic(corpus: ModuleType) -> None:
    a = corpus.make_robot_samples(seed=3)
    b = corpus.make_robot_samples(seed=3)
    c = corpus.make_robot_samples(seed=4)
    for name in a[1]:
        np.testing.assert_array_equal(a[1][name], b[1][name])
    assert len(a[1]["index"]) != len(c[1]["index"]) or not np.array_equal(
        a[1]["observation.state"], c[1]["observation.state"]
    )
    imgs_a = corpus.make_image_samples(seed=1, num_images=6)
    imgs_b = corpus.make_image_samples(seed=1, num_images=6)
    assert imgs_a[1]["image"] == imgs_b[1]["image"]
    assert imgs_a[1]["caption"] == imgs_b[1]["caption"]


def test_image_samples_are_real_encoded_images(corpus: ModuleType, images) -> None:
    features, data, tasks = images
    assert tasks == []
    assert features["image"]["dtype"] == "image"
    height, width, _ = features["image"]["shape"]
    n = len(data["image"])
    assert n == len(data["label"]) == len(data["caption"]) > 0
    formats = set()
    for blob, label, caption in zip(data["image"], data["label"], data["caption"], strict=True):
        assert isinstance(blob, bytes)
        with Image.open(io.BytesIO(blob)) as img:
            formats.add(img.format)
            assert img.size == (width, height)
            assert img.mode == "RGB"
        shape, _, colour = corpus.IMAGE_CLASSES[int(label)]
        assert f"{colour} {shape}" in caption
    assert formats == {"JPEG", "PNG"}
    assert data["label"].dtype == np.int64


# -- the quickstart: write, open, read back, verify, inspect ---------------------------------------


def test_robot_quickstart_round_trip(corpus: ModuleType, robot, tmp_path: Path) -> None:
    _, data, tasks = robot
    root = tmp_path / "quickstart"
    manifest = _write_robot(corpus, robot, root, overwrite=True)
    n = len(data["index"])
    assert manifest.num_samples == n

    with open_dataset(root) as ds:
        assert len(ds) == n
        assert len(ds.shards) >= 3, "a 48KB target should give several shards"
        assert ds.info.fps == corpus.ROBOT_FPS
        assert ds.info.total_episodes == 20
        assert ds.info.total_tasks == len(tasks)
        batch = ds.read(0, n)
        for name, values in data.items():
            np.testing.assert_array_equal(batch[name].reshape(values.shape), values)
        # shards follow the data order and never split an episode
        assert ds.shards[0].index_start == 0
        assert ds.shards[-1].index_end == n
        for a, b in zip(ds.shards, ds.shards[1:], strict=False):
            assert a.index_end == b.index_start
        for shard in ds.shards:
            first, last = data["episode_index"][[shard.index_start, shard.index_end - 1]]
            before = data["episode_index"][shard.index_start - 1] if shard.index_start else -1
            assert before != first, f"{shard.path} starts mid-episode"
            assert last == data["episode_index"][shard.index_end - 1]
        row = ds[n - 1]
        assert int(row["index"]) == n - 1
        assert int(row["episode_index"]) == 19

    assert shardfeed_main(["verify", str(root)]) == 0
    assert shardfeed_main(["verify", "--no-hash", str(root)]) == 0
    code, out = _cli("inspect", str(root))
    assert code == 0
    assert f"{n:,}" in out
    assert "episodes       20" in out
    code, out = _cli("inspect", "--json", str(root))
    assert code == 0
    summary = json.loads(out)
    assert summary["num_samples"] == n
    assert summary["num_shards"] == len(manifest.shards)


def test_quickstart_overwrite_and_determinism(corpus: ModuleType, robot, tmp_path: Path) -> None:
    root = tmp_path / "ds"
    _write_robot(corpus, robot, root)
    first = (root / MANIFEST_PATH).read_bytes()
    shard_bytes = {p: p.read_bytes() for p in sorted((root / "data").rglob("*.parquet"))}
    # a second write without overwrite is refused; with overwrite it is byte-identical
    with pytest.raises(Exception, match="overwrite"):
        _write_robot(corpus, robot, root)
    _write_robot(corpus, robot, root, overwrite=True)
    assert (root / MANIFEST_PATH).read_bytes() == first
    assert {p: p.read_bytes() for p in sorted((root / "data").rglob("*.parquet"))} == shard_bytes
    assert shardfeed_main(["verify", str(root)]) == 0


def test_verify_catches_a_corrupted_shard(corpus: ModuleType, robot, tmp_path: Path) -> None:
    """The quickstart's `verify` exit code means something: flip one byte and it fails."""
    root = tmp_path / "ds"
    manifest = _write_robot(corpus, robot, root)
    shard = root / manifest.shards[1].path
    blob = bytearray(shard.read_bytes())
    blob[len(blob) // 2] ^= 0xFF
    shard.write_bytes(bytes(blob))
    assert shardfeed_main(["verify", str(root)]) == 1


def test_image_quickstart_round_trip(images, tmp_path: Path) -> None:
    features, data, tasks = images
    root = tmp_path / "images"
    manifest = write_dataset(root, features, data, tasks=tasks, target_shard_size="200KB")
    with open_dataset(root) as ds:
        assert len(ds) == len(data["image"])
        assert len(ds.shards) >= 3
        batch = ds.read(0, len(ds))
        assert list(batch["image"]) == data["image"]
        np.testing.assert_array_equal(batch["label"], data["label"])
        assert list(batch["caption"]) == data["caption"]
    assert manifest.num_samples == len(data["image"])
    assert shardfeed_main(["verify", str(root)]) == 0


def test_script_main_writes_a_dataset(corpus: ModuleType, tmp_path: Path, capsys) -> None:
    root = tmp_path / "sample"
    assert corpus.main(["--kind", "images", "--out", str(root), "--seed", "2"]) == 0
    assert "240 samples" in capsys.readouterr().out
    with open_dataset(root) as ds:
        assert len(ds) == 240
        assert len(ds.shards) > 1
    # refusing to clobber is a clean error, not a traceback
    assert corpus.main(["--kind", "images", "--out", str(root)]) == 1
    assert "overwrite" in capsys.readouterr().err
    assert corpus.main(["--kind", "robot", "--out", str(root), "--overwrite"]) == 0
    with open_dataset(root) as ds:
        assert ds.info.total_episodes == 20


# -- raw corpora for `shardfeed convert`: what quickstart.sh converts -----------------------------


def _files(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_imagefolder_corpus_is_raw_and_deterministic(corpus: ModuleType, tmp_path: Path) -> None:
    root = tmp_path / "images"
    assert corpus.write_imagefolder_corpus(root, num_images=40, bad=2) == 42
    files = _files(root)
    classes = sorted(c[0] for c in corpus.IMAGE_CLASSES)
    assert sorted({name.split("/")[0] for name in files}) == classes
    _, data, _ = corpus.make_image_samples(0, num_images=40)
    good = {name: blob for name, blob in files.items() if "/bad-" not in name}
    assert sorted(good.values()) == sorted(data["image"])  # the samples, byte for byte
    for name, blob in good.items():
        with Image.open(io.BytesIO(blob)) as img:
            assert img.format == ("JPEG" if name.endswith(".jpg") else "PNG")
    assert sorted(set(files) - set(good)) == ["circle/bad-0.jpg", "square/bad-1.png"]
    # the same seed gives the same bytes; --overwrite replaces, and only what the maker wrote
    again = tmp_path / "again"
    corpus.write_imagefolder_corpus(again, num_images=40, bad=2)
    assert _files(again) == files
    with pytest.raises(FileExistsError, match="overwrite"):
        corpus.write_imagefolder_corpus(root, num_images=40)
    corpus.write_imagefolder_corpus(root, num_images=8, overwrite=True)
    assert len(_files(root)) == 8
    (root / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="did not write"):
        corpus.write_imagefolder_corpus(root, overwrite=True)
    assert (root / "notes.txt").exists()


def test_jsonl_corpus_is_raw_and_deterministic(corpus: ModuleType, tmp_path: Path) -> None:
    root = tmp_path / "jsonl"
    assert corpus.write_jsonl_corpus(root, num_records=300, bad=3) == corpus.JSONL_FILES
    files = _files(root)
    assert sorted(files) == [f"part-{k}.jsonl" for k in range(corpus.JSONL_FILES)]
    lines = [line for name in sorted(files) for line in files[name].decode().splitlines()]
    assert len(lines) == 303
    records, broken = [], []
    for line in lines:
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            broken.append(line)
            continue
        (records if "text" in obj else broken).append(obj)
    assert len(broken) == 3
    assert [r["id"] for r in records] == list(range(300))
    assert all(isinstance(r["text"], str) and r["text"] for r in records)
    assert len({len(r["text"]) for r in records}) > 20, "text sizes should vary"
    corpus.write_jsonl_corpus(tmp_path / "again", num_records=300, bad=3)
    assert _files(tmp_path / "again") == files


def test_script_main_writes_raw_corpora(corpus: ModuleType, tmp_path: Path, capsys) -> None:
    root = tmp_path / "src"
    argv = ["--kind", "imagefolder-corpus", "--out", str(root), "--count", "12", "--bad", "1"]
    assert corpus.main(argv) == 0
    assert "12 images and 1 broken input(s) in 13 files" in capsys.readouterr().out
    assert corpus.main(argv) == 1  # not empty, no --overwrite: a clean error
    assert "overwrite" in capsys.readouterr().err
    assert corpus.main([*argv, "--overwrite"]) == 0
    argv = ["--kind", "jsonl-corpus", "--out", str(tmp_path / "j"), "--count", "50"]
    assert corpus.main(argv) == 0
    assert "50 records in 4 files" in capsys.readouterr().out
    for bad in (["--target-shard-size", "1KB"], ["--bad", "-1"]):
        with pytest.raises(SystemExit) as info:
            corpus.main([*argv, *bad])
        assert info.value.code == 2
    with pytest.raises(SystemExit):
        corpus.main(["--kind", "robot", "--out", str(tmp_path / "r"), "--bad", "1"])


def test_quickstart_convert_path(corpus: ModuleType, tmp_path: Path, capsys) -> None:
    """quickstart.sh minus the venv: raw image folder -> convert -> verify, rejects, inspect."""
    pytest.importorskip("apache_beam")
    script = QUICKSTART.read_text()
    assert "--kind imagefolder-corpus" in script and "--bad 2" in script
    assert (
        '"$VENV/bin/shardfeed" convert "$SRC" "$OUT" --overwrite --target-shard-size 150KB'
        in script
    )
    src, dst = tmp_path / "quickstart-src", tmp_path / "quickstart"
    assert corpus.main(["--kind", "imagefolder-corpus", "--out", str(src), "--bad", "2"]) == 0
    argv = ["convert", str(src), str(dst), "--overwrite", "--target-shard-size", "150KB"]
    capsys.readouterr()
    assert shardfeed_main([*argv, "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert (summary["samples_in"], summary["samples_out"]) == (242, 240)
    assert summary["rejects"] == {
        "total": 2,
        "by_reason": {"image_not_image": 1, "image_truncated": 1},
    }
    with open_dataset(dst) as ds:
        assert len(ds) == 240 and len(ds.shards) >= 5
        labels = ds.read(0, len(ds), columns=["label"])["label"]
        assert sorted(np.bincount(labels).tolist()) == sorted(
            np.bincount(corpus.make_image_samples(0)[1]["label"]).tolist()
        )
        assert ds.info.features["label"].names == sorted(c[0] for c in corpus.IMAGE_CLASSES)
    assert shardfeed_main(["verify", str(dst)]) == 0
    capsys.readouterr()
    assert shardfeed_main(["rejects", "--json", str(dst)]) == 0
    listed = json.loads(capsys.readouterr().out)["rejects"]
    assert [(r["source"], r["reason"]) for r in listed] == [
        ("circle/bad-0.jpg", "image_truncated"),
        ("square/bad-1.png", "image_not_image"),
    ]
    code, out = _cli("inspect", str(dst))
    assert code == 0 and "samples        240" in out and "image_truncated" in out
    # a re-run replaces the dataset with the same bytes
    manifest = (dst / MANIFEST_PATH).read_bytes()
    assert shardfeed_main(argv) == 0
    assert (dst / MANIFEST_PATH).read_bytes() == manifest
