"""The real ``lerobot`` library loads what ``shardfeed convert`` writes, frame for frame.

Run by ``scripts/test_lerobot_interop.sh`` inside ``.venv-lerobot`` (CPU torch 2.13, lerobot 0.4.4
installed with ``--no-deps`` plus the packages its dataset loading path imports, shardfeed[beam]).
The main suite never collects this file: its name does not match pytest's ``test_*.py`` pattern and
``tests/interop`` has no ``conftest.py``, so the main ``.venv`` never imports torch or lerobot.

Three datasets go through ``shardfeed convert`` (shuffled, several shards each) and are opened with
``LeRobotDataset(repo_id, root=DST)``:

- a generated LeRobot v2.1 dataset with two image features (PNG and JPEG, stored inline as Hugging
  Face ``{bytes, path}`` structs), bool and float scalars, three tasks and an episode that switches
  task; it always runs;
- ``$SHARDFEED_CORPORA/lerobot_v30_reachy2_apple_storage`` (LeRobot v3.0, 3 episodes, 899 frames);
- ``$SHARDFEED_CORPORA/lerobot_v21_unitree_g1`` with ``--drop-videos`` (only 3 of its 100 MP4s
  exist; 100 episodes, 35,965 frames).

Every frame LeRobot returns is compared with shardfeed's own reader and with the source frame it came
from (values and dtypes), images are decoded to pixels, and LeRobot's episode index ranges, tasks and
stats are checked against the data. Nothing touches the network: HF_HUB_OFFLINE and
HF_DATASETS_OFFLINE are set, HF_HOME is a temporary directory, and a socket guard refuses every
connection outside loopback.
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import importlib
import importlib.util
import io
import ipaddress
import json
import os
import shutil
import socket
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from shardfeed import open_dataset, write_dataset
from shardfeed.cli.main import main as shardfeed_main
from shardfeed.schemas import Feature, FeatureSpec

CORPORA = os.environ.get("SHARDFEED_CORPORA")
needs_corpora = pytest.mark.skipif(
    not CORPORA, reason="SHARDFEED_CORPORA is not set (scripts/test.sh sets it)"
)
REPO_ID = "local/shardfeed-interop"
NUMERIC = {
    "bool",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "float16",
    "float32",
    "float64",
}


# ---- offline environment and the lerobot import ---------------------------------------------


def _offline_environment() -> str:
    """Point every Hugging Face cache at a fresh temporary directory and forbid hub access.

    huggingface_hub and datasets read these variables when first imported, so this runs before
    either is imported (the ``lerobot`` fixture checks that it did)."""
    home = tempfile.mkdtemp(prefix="shardfeed-interop-hf-")
    atexit.register(shutil.rmtree, home, True)
    os.environ.update(
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        HF_HUB_DISABLE_TELEMETRY="1",
        HF_HOME=home,
        HF_LEROBOT_HOME=os.path.join(home, "lerobot"),
    )
    return home


def _loopback_only(address: Any) -> None:
    if not isinstance(address, tuple):  # AF_UNIX paths and the like never leave the machine
        return
    host = str(address[0]).split("%")[0]
    if host == "localhost":
        return
    try:
        if ipaddress.ip_address(host).is_loopback:
            return
    except ValueError:
        pass
    raise OSError(f"the interop tests stay offline: connection to {address!r} refused")


@pytest.fixture(scope="session", autouse=True)
def no_network():
    """Refuse socket connections and name lookups outside loopback for the whole session."""
    real_connect, real_connect_ex = socket.socket.connect, socket.socket.connect_ex
    real_getaddrinfo = socket.getaddrinfo

    def connect(self, address):
        _loopback_only(address)
        return real_connect(self, address)

    def connect_ex(self, address):
        _loopback_only(address)
        return real_connect_ex(self, address)

    def getaddrinfo(host, *args, **kwargs):
        if host not in (None, b"localhost"):
            _loopback_only((host.decode() if isinstance(host, bytes) else host, 0))
        return real_getaddrinfo(host, *args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(socket.socket, "connect", connect)
        mp.setattr(socket.socket, "connect_ex", connect_ex)
        mp.setattr(socket, "getaddrinfo", getaddrinfo)
        yield


def _torchvision_without_ops() -> None:
    """Let ``import torchvision`` succeed when its C++ ops library cannot load.

    PyPI's torchvision 0.28.0 wheel is built against CUDA torch, so next to the CPU torch 2.13.0 wheel
    this machine has, its ``_C`` library fails to load (``libc10_cuda.so`` is missing). torchvision
    tolerates that, except that ``torchvision/_meta_registrations.py`` then registers fake kernels
    for ``torchvision::nms`` and ``torchvision::qnms`` unconditionally and the import dies with
    "operator torchvision::nms does not exist". Declaring those two schemas (with no kernels) lets
    the import through. lerobot's dataset loading path only uses ``torchvision.transforms``
    (``ToTensor``, pure Python); nms and qnms stay unusable, as they are without the library.
    """
    import torch

    spec = importlib.util.find_spec("torchvision")
    assert spec is not None and spec.submodule_search_locations, "torchvision is not installed"
    libraries = glob.glob(os.path.join(spec.submodule_search_locations[0], "_C*.so"))
    try:
        if libraries:
            torch.ops.load_library(libraries[0])
            return  # a torchvision that matches torch: nothing to do
    except OSError:
        pass
    library = torch.library.Library("torchvision", "FRAGMENT")
    library.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    library.define("qnms(Tensor qdets, Tensor scores, float iou_threshold) -> Tensor")
    _torchvision_without_ops.library = library  # keep the registration alive


@pytest.fixture(scope="session")
def lerobot():
    """lerobot's dataset classes, imported offline; also torch and datasets."""
    assert "huggingface_hub" not in sys.modules and "datasets" not in sys.modules, (
        "huggingface_hub/datasets were imported before the offline environment was set"
    )
    home = _offline_environment()
    _torchvision_without_ops()
    import datasets
    import huggingface_hub.constants
    import torch
    from lerobot.datasets.lerobot_dataset import LeRobotDataset, LeRobotDatasetMetadata

    assert huggingface_hub.constants.HF_HUB_OFFLINE
    assert datasets.config.HF_DATASETS_OFFLINE
    assert str(datasets.config.HF_DATASETS_CACHE).startswith(home)
    return SimpleNamespace(
        LeRobotDataset=LeRobotDataset,
        LeRobotDatasetMetadata=LeRobotDatasetMetadata,
        torch=torch,
        datasets=datasets,
    )


# ---- sources: read with pyarrow, independently of shardfeed ----------------------------------


@dataclass
class Source:
    """A LeRobot source read with pyarrow alone: info.json, tasks and frames by episode."""

    root: Path
    info: dict[str, Any]
    tasks: list[str]  # by task_index
    episodes: dict[int, dict[str, Any]]  # source episode_index -> column -> values (numpy / list)

    @property
    def stored(self) -> dict[str, dict[str, Any]]:
        return {k: f for k, f in self.info["features"].items() if f["dtype"] != "video"}


def column_values(column: pa.ChunkedArray | pa.Array, feature: dict[str, Any]) -> Any:
    """A column as numpy ``(N, *shape)`` (scalars ``(N,)``) or, for images, a list of bytes."""
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if feature["dtype"] == "image":
        return array.field("bytes").to_pylist()
    if feature["dtype"] == "string":
        return array.to_pylist()
    if pa.types.is_list(array.type) or pa.types.is_fixed_size_list(array.type):
        values = array.flatten().to_numpy(zero_copy_only=False)
        values = values.reshape(len(array), *feature["shape"])
    else:
        values = array.to_numpy(zero_copy_only=False)
    assert values.dtype == np.dtype(feature["dtype"]), (feature, values.dtype)
    return values


def read_source(root: Path) -> Source:
    info = json.loads((root / "meta/info.json").read_text())
    if info["codebase_version"] == "v3.0":
        frame = pq.read_table(root / "meta/tasks.parquet").to_pandas()
        tasks = [task for task, _ in sorted(frame["task_index"].items(), key=lambda kv: kv[1])]
    else:
        rows = [json.loads(line) for line in (root / "meta/tasks.jsonl").read_text().splitlines()]
        tasks = [r["task"] for r in sorted(rows, key=lambda r: r["task_index"])]
    features = {k: f for k, f in info["features"].items() if f["dtype"] != "video"}
    episodes: dict[int, dict[str, Any]] = {}
    for path in sorted((root / "data").glob("*/*.parquet")):
        table = pq.read_table(path, columns=list(features))
        ids = table.column("episode_index").to_numpy()
        for episode in np.unique(ids).tolist():
            rows = np.flatnonzero(ids == episode)
            part = table.slice(int(rows[0]), len(rows))
            assert len(rows) == rows[-1] - rows[0] + 1, "source episode rows are not contiguous"
            episodes[episode] = {k: column_values(part.column(k), f) for k, f in features.items()}
    return Source(root, info, tasks, episodes)


# ---- a generated LeRobot v2.1 dataset with image features ------------------------------------

GEN_FPS = 10
GEN_LENGTHS = [7, 12, 5, 16, 9, 11]
GEN_TASKS = ["pick up the red cube", "put the cube in the bin", "wave at the camera"]
FRONT = (12, 16, 3)  # PNG, lossless: pixels must come back exactly
WRIST = (8, 10, 3)  # JPEG: pixels must equal what PIL decodes from the stored bytes
GEN_FEATURES: dict[str, dict[str, Any]] = {
    "observation.images.front": {
        "dtype": "image",
        "shape": list(FRONT),
        "names": ["height", "width", "channels"],
    },
    "observation.images.wrist": {
        "dtype": "image",
        "shape": list(WRIST),
        "names": ["height", "width", "channels"],
    },
    "observation.state": {
        "dtype": "float32",
        "shape": [6],
        "names": [f"joint_{i}" for i in range(6)],
    },
    "action": {"dtype": "float32", "shape": [6], "names": [f"joint_{i}" for i in range(6)]},
    "next.reward": {"dtype": "float32", "shape": [1], "names": None},
    "next.done": {"dtype": "bool", "shape": [1], "names": None},
    "timestamp": {"dtype": "float32", "shape": [1], "names": None},
    "frame_index": {"dtype": "int64", "shape": [1], "names": None},
    "episode_index": {"dtype": "int64", "shape": [1], "names": None},
    "index": {"dtype": "int64", "shape": [1], "names": None},
    "task_index": {"dtype": "int64", "shape": [1], "names": None},
}
GEN_DATA = "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet"


def _encode(pixels: np.ndarray, fmt: str) -> bytes:
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format=fmt, **({"quality": 90} if fmt == "JPEG" else {}))
    return out.getvalue()


def _gen_task_indices(episode: int, length: int) -> np.ndarray:
    tasks = np.full(length, episode % len(GEN_TASKS), dtype=np.int64)
    if episode == 3:  # this episode switches task halfway: two tasks in one episode
        tasks[length // 2 :] = (episode + 1) % len(GEN_TASKS)
    return tasks


def make_generated_v21(root: Path) -> dict[int, np.ndarray]:
    """Write the generated dataset; returns the PNG camera's pixels by episode (N, H, W, C)."""
    image_type = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    pixels_by_episode, first, episodes_jsonl = {}, 0, []
    for episode, length in enumerate(GEN_LENGTHS):
        rng = np.random.default_rng(1000 + episode)
        front = rng.integers(0, 256, size=(length, *FRONT), dtype=np.uint8)
        wrist = rng.integers(0, 256, size=(length, *WRIST), dtype=np.uint8)
        pixels_by_episode[episode] = front
        state = rng.normal(size=(length, 6)).astype(np.float32)
        action = rng.normal(size=(length, 6)).astype(np.float32)
        tasks = _gen_task_indices(episode, length)
        table = pa.table(
            {
                "observation.images.front": pa.array(
                    [{"bytes": _encode(p, "PNG"), "path": None} for p in front], image_type
                ),
                "observation.images.wrist": pa.array(
                    [{"bytes": _encode(p, "JPEG"), "path": None} for p in wrist], image_type
                ),
                "observation.state": pa.FixedSizeListArray.from_arrays(
                    pa.array(state.reshape(-1)), 6
                ),
                "action": pa.FixedSizeListArray.from_arrays(pa.array(action.reshape(-1)), 6),
                "next.reward": pa.array(rng.random(length).astype(np.float32)),
                "next.done": pa.array(np.arange(length) == length - 1),
                "timestamp": pa.array(np.arange(length, dtype=np.float32) / GEN_FPS),
                "frame_index": pa.array(np.arange(length, dtype=np.int64)),
                "episode_index": pa.array(np.full(length, episode, dtype=np.int64)),
                "index": pa.array(np.arange(first, first + length, dtype=np.int64)),
                "task_index": pa.array(tasks),
            }
        )
        path = root / GEN_DATA.format(episode_chunk=0, episode_index=episode)
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, path)
        first += length
        episode_tasks = [GEN_TASKS[t] for t in dict.fromkeys(tasks.tolist())]
        episodes_jsonl.append({"episode_index": episode, "tasks": episode_tasks, "length": length})
    info = {
        "codebase_version": "v2.1",
        "robot_type": "toy_arm",
        "total_episodes": len(GEN_LENGTHS),
        "total_frames": first,
        "total_tasks": len(GEN_TASKS),
        "total_videos": 0,
        "total_chunks": 1,
        "chunks_size": 1000,
        "fps": GEN_FPS,
        "splits": {"train": f"0:{len(GEN_LENGTHS)}"},
        "data_path": GEN_DATA,
        "video_path": "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4",
        "features": GEN_FEATURES,
    }
    (root / "meta").mkdir(parents=True, exist_ok=True)
    (root / "meta/info.json").write_text(json.dumps(info, indent=4))
    (root / "meta/episodes.jsonl").write_text("".join(json.dumps(e) + "\n" for e in episodes_jsonl))
    (root / "meta/tasks.jsonl").write_text(
        "".join(json.dumps({"task_index": i, "task": t}) + "\n" for i, t in enumerate(GEN_TASKS))
    )
    return pixels_by_episode


# ---- conversion and what shardfeed wrote ------------------------------------------------------


@dataclass
class Converted:
    """A source, its conversion by ``shardfeed convert`` and shardfeed's own view of the output."""

    source: Source
    dst: Path
    rows: dict[str, Any]  # shardfeed's reader: every stored column of the whole dataset
    episodes: list[dict[str, Any]]  # our meta/episodes rows, read with pyarrow
    tasks: list[str]  # our meta/tasks.parquet, by task_index
    num_shards: int

    @property
    def num_frames(self) -> int:
        return len(self.rows["index"])

    def source_frame(self, i: int) -> dict[str, Any]:
        """The source frame behind output row ``i``: its source episode, at the same offset."""
        episode = self.episodes[int(self.rows["episode_index"][i])]
        columns = self.source.episodes[episode["source_episode_index"]]
        offset = i - episode["dataset_from_index"]
        return {name: values[offset] for name, values in columns.items()}


def convert(src: Path, dst: Path, *flags: str) -> Converted:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = shardfeed_main(["convert", str(src), str(dst), "--json", *flags])
    assert code == 0, out.getvalue()
    summary = json.loads(out.getvalue())
    assert summary["rejects"]["total"] == 0, summary
    ours = open_dataset(dst)
    rows = ours.read(0, len(ours))
    assert len(ours) == summary["samples_out"]
    episodes = pq.read_table(dst / "meta/episodes/chunk-000/file-000.parquet").to_pylist()
    frame = pq.read_table(dst / "meta/tasks.parquet").to_pandas()
    tasks = [task for task, _ in sorted(frame["task_index"].items(), key=lambda kv: kv[1])]
    return Converted(read_source(src), dst, rows, episodes, tasks, len(ours.shards))


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    src = tmp_path_factory.mktemp("generated") / "src"
    pixels = make_generated_v21(src)
    converted = convert(
        src,
        src.parent / "dst",
        "--target-shard-size",
        "20KB",
        "--row-group-size",
        "4KB",
    )
    assert converted.num_shards >= 3
    return converted, pixels


@pytest.fixture(scope="module")
def reachy(tmp_path_factory):
    src = Path(CORPORA or "", "lerobot_v30_reachy2_apple_storage")
    converted = convert(
        src, tmp_path_factory.mktemp("reachy") / "dst", "--target-shard-size", "60KB"
    )
    assert converted.num_shards == 3
    return converted


@pytest.fixture(scope="module")
def unitree(tmp_path_factory):
    src = Path(CORPORA or "", "lerobot_v21_unitree_g1")
    converted = convert(
        src,
        tmp_path_factory.mktemp("unitree") / "dst",
        "--drop-videos",
        "--target-shard-size",
        "1MB",
    )
    assert converted.num_shards >= 5
    return converted


# ---- the checks --------------------------------------------------------------------------------


def as_numpy(value: Any) -> Any:
    return value.numpy() if hasattr(value, "numpy") else value


def check_item(lr, conv: Converted, ds, i: int, item: dict[str, Any]) -> None:
    """``ds[i]`` equals row ``i`` of shardfeed's reader and the source frame behind it."""
    source = conv.source_frame(i)
    for name, feature in conv.source.stored.items():
        dtype, shape = feature["dtype"], tuple(feature["shape"])
        value = item[name]
        if dtype == "string":
            assert value == conv.rows[name][i] == source[name], (name, i)
            continue
        if dtype == "image":
            assert isinstance(value, lr.torch.Tensor) and value.dtype == lr.torch.float32, name
            assert tuple(value.shape) == (shape[2], shape[0], shape[1]), (name, value.shape)
            ours = np.asarray(Image.open(io.BytesIO(conv.rows[name][i])).convert("RGB"))
            theirs = np.asarray(Image.open(io.BytesIO(source[name])).convert("RGB"))
            pixels = np.rint(value.numpy() * 255).astype(np.uint8).transpose(1, 2, 0)
            np.testing.assert_array_equal(pixels, ours, err_msg=f"{name} @ {i}")
            np.testing.assert_array_equal(pixels, theirs, err_msg=f"{name} @ {i}")
            continue
        array = as_numpy(value)
        assert array.dtype == np.dtype(dtype), (name, array.dtype, dtype)
        assert array.shape == (() if shape == (1,) else shape), (name, array.shape)
        np.testing.assert_array_equal(array, conv.rows[name][i], err_msg=f"{name} @ {i}")
        assert np.asarray(conv.rows[name][i]).dtype == array.dtype, name
        if name == "index":
            assert int(array) == i
        elif name == "episode_index":  # renumbered in output order; the source id is kept aside
            assert conv.episodes[int(array)]["dataset_from_index"] <= i
        else:
            expected = np.asarray(source[name])
            assert expected.dtype == array.dtype, (name, expected.dtype)
            np.testing.assert_array_equal(array, expected, err_msg=f"{name} @ {i} vs source")
    assert item["task"] == conv.source.tasks[int(source["task_index"])]
    assert item["task"] == conv.tasks[int(item["task_index"])]


def spread(conv: Converted, extra: int = 25) -> list[int]:
    """First, last, every episode boundary and some random frames."""
    picks = {0, conv.num_frames - 1}
    for ep in conv.episodes:
        picks |= {ep["dataset_from_index"], ep["dataset_to_index"] - 1}
    rng = np.random.default_rng(7)
    picks |= set(rng.integers(0, conv.num_frames, size=extra).tolist())
    return sorted(picks)


def check_whole_table(ds, conv: Converted) -> None:
    """The Arrow table LeRobot built from our files equals shardfeed's read, column by column."""
    table = ds.hf_dataset.data.table
    assert table.num_rows == conv.num_frames
    assert sorted(table.column_names) == sorted(conv.source.stored)
    for name, feature in conv.source.stored.items():
        theirs = column_values(table.column(name), feature)
        if feature["dtype"] in ("image", "string"):
            assert theirs == list(conv.rows[name]), name
        else:
            assert theirs.dtype == conv.rows[name].dtype, name
            np.testing.assert_array_equal(theirs, conv.rows[name], err_msg=name)


def check_against_source(conv: Converted) -> None:
    """Every output episode is its source episode, renumbered only in episode_index and index."""
    seen = []
    for ep in conv.episodes:
        lo, hi = ep["dataset_from_index"], ep["dataset_to_index"]
        source = conv.source.episodes[ep["source_episode_index"]]
        seen.append(ep["source_episode_index"])
        for name in conv.source.stored:
            if name in ("index", "episode_index"):
                continue
            ours, theirs = conv.rows[name][lo:hi], source[name]
            if isinstance(theirs, list):
                assert list(ours) == theirs, name
            else:
                assert ours.dtype == theirs.dtype, name
                np.testing.assert_array_equal(ours, theirs, err_msg=name)
    assert sorted(seen) == sorted(conv.source.episodes)


def check_metadata(lr, conv: Converted) -> Any:
    meta = lr.LeRobotDatasetMetadata(REPO_ID, root=conv.dst)
    info = conv.source.info
    assert meta.info["codebase_version"] == "v3.0"
    assert (
        meta.total_frames
        == conv.num_frames
        == sum(len(e["index"]) for e in conv.source.episodes.values())
    )
    assert meta.total_episodes == len(conv.source.episodes) == len(conv.episodes)
    assert meta.total_tasks == len(meta.tasks) == len(conv.source.tasks)
    assert meta.fps == info["fps"] and meta.robot_type == info["robot_type"]
    # features: the source's, minus dropped videos; lerobot turns shapes into tuples
    assert list(meta.features) == list(conv.source.stored)
    for name, feature in conv.source.stored.items():
        ours = meta.features[name]
        assert (ours["dtype"], ours["shape"], ours["names"]) == (
            feature["dtype"],
            tuple(feature["shape"]),
            feature["names"],
        ), name
    assert meta.video_keys == []
    assert (
        meta.camera_keys
        == meta.image_keys
        == [k for k, f in conv.source.stored.items() if f["dtype"] == "image"]
    )
    # tasks: a DataFrame indexed by the task string, as lerobot writes it
    assert list(meta.tasks.index) == conv.tasks
    assert meta.tasks["task_index"].tolist() == list(range(len(conv.tasks)))
    assert sorted(conv.tasks) == sorted(conv.source.tasks)
    # episodes: contiguous ranges in file order, pointing at the file that holds them
    episodes = meta.episodes.to_list() if hasattr(meta.episodes, "to_list") else list(meta.episodes)
    assert [e["episode_index"] for e in episodes] == list(range(meta.total_episodes))
    assert episodes[0]["dataset_from_index"] == 0
    assert episodes[-1]["dataset_to_index"] == meta.total_frames
    data_files: dict[Path, pa.Table] = {}
    for e, ours in zip(episodes, conv.episodes, strict=True):
        lo, hi = e["dataset_from_index"], e["dataset_to_index"]
        assert (lo, hi, e["length"]) == (
            ours["dataset_from_index"],
            ours["dataset_to_index"],
            hi - lo,
        )
        if e["episode_index"] + 1 < len(episodes):
            assert episodes[e["episode_index"] + 1]["dataset_from_index"] == hi
        assert np.all(conv.rows["episode_index"][lo:hi] == e["episode_index"])
        frames = [conv.tasks[t] for t in conv.rows["task_index"][lo:hi].tolist()]
        assert e["tasks"] == list(dict.fromkeys(frames))
        source = conv.source.episodes[ours["source_episode_index"]]
        assert hi - lo == len(source["index"])
        path = conv.dst / meta.get_data_file_path(e["episode_index"])
        if path not in data_files:
            data_files[path] = pq.read_table(path, columns=["episode_index", "index"])
        data_file = data_files[path]
        in_file = data_file.filter(pa.compute.equal(data_file["episode_index"], e["episode_index"]))
        np.testing.assert_array_equal(in_file["index"].to_numpy(), np.arange(lo, hi))
    # stats: numeric arrays for every numeric feature, true to the data
    stats = meta.stats
    numeric = [k for k, f in conv.source.stored.items() if f["dtype"] in NUMERIC]
    cameras = [k for k, f in conv.source.stored.items() if f["dtype"] == "image"]
    assert set(stats) == set(numeric) | set(cameras)
    # cameras: per-channel (3, 1, 1) stats on pixels in [0, 1], as lerobot's normalizer expects
    for name in cameras:
        entry = stats[name]
        for key in ("min", "max", "mean", "std"):
            assert entry[key].shape == (3, 1, 1), (name, key)
        assert np.all(entry["min"] >= 0) and np.all(entry["max"] <= 1), name
    for name in numeric:
        shape = tuple(meta.features[name]["shape"])
        data = conv.rows[name].reshape(conv.num_frames, *shape)
        entry = stats[name]
        assert {"min", "max", "mean", "std", "count"} <= set(entry), name
        for key in ("min", "max", "mean", "std"):
            assert entry[key].dtype.kind in "biuf" and entry[key].shape == shape, (name, key)
        np.testing.assert_array_equal(entry["min"], data.min(axis=0), err_msg=name)
        np.testing.assert_array_equal(entry["max"], data.max(axis=0), err_msg=name)
        as_float = data.astype(np.float64)
        np.testing.assert_allclose(entry["mean"], as_float.mean(axis=0), rtol=1e-6, atol=1e-9)
        np.testing.assert_allclose(entry["std"], as_float.std(axis=0), rtol=1e-6, atol=1e-9)
        assert entry["count"].tolist() == [conv.num_frames]
    return meta


def check_hf_features(lr, ds, dst: Path) -> None:
    """The features every shard declares to Hugging Face ``datasets`` (its ``huggingface`` schema
    metadata, which a plain ``load_dataset("parquet", ...)`` uses) agree with the ones lerobot
    builds from info.json: the same feature for images, scalars and vectors; for a tensor of 2+
    dimensions, which lerobot declares as ArrayND, nested fixed-length lists of its shape and
    dtype (what the column stores). And ``datasets`` takes each declared feature as it is."""
    hf = lr.datasets
    paths = sorted(dst.glob("data/*/*.parquet"))
    assert paths
    for path in paths:
        schema = pq.read_schema(path)
        meta = json.loads(schema.metadata[b"huggingface"])
        declared = hf.Features.from_dict(meta["info"]["features"])
        assert hf.Features.from_arrow_schema(schema) == declared, path
        assert set(declared) == set(ds.hf_features), path
        for name, theirs in ds.hf_features.items():
            ours = declared[name]
            if hasattr(theirs, "shape"):  # Array2D .. Array5D
                shape, leaf = [], ours
                while isinstance(leaf, hf.List):
                    shape.append(leaf.length)
                    leaf = leaf.feature
                assert tuple(shape) == tuple(theirs.shape), (name, shape, theirs)
                assert leaf == hf.Value(theirs.dtype), (name, leaf, theirs)
            else:
                assert ours == theirs, (name, ours, theirs)


def check_dataset(lr, conv: Converted, indices: list[int]) -> Any:
    check_against_source(conv)
    meta = check_metadata(lr, conv)
    ds = lr.LeRobotDataset(REPO_ID, root=conv.dst)
    assert len(ds) == ds.num_frames == ds.meta.total_frames == meta.total_frames
    assert ds.num_episodes == meta.total_episodes
    assert ds.features == meta.features
    check_hf_features(lr, ds, conv.dst)
    check_whole_table(ds, conv)
    for i in indices:
        check_item(lr, conv, ds, i, ds[i])
    return ds


# ---- tests -------------------------------------------------------------------------------------


def test_generated_images_load_in_lerobot(lerobot, generated):
    conv, pixels = generated
    ds = check_dataset(lerobot, conv, list(range(conv.num_frames)))
    assert ds.meta.camera_keys == ["observation.images.front", "observation.images.wrist"]
    assert isinstance(ds.hf_features["observation.images.front"], lerobot.datasets.Image)
    # the PNG camera comes back as the exact pixels that were generated
    for ep in conv.episodes:
        lo = ep["dataset_from_index"]
        for offset, expected in enumerate(pixels[ep["source_episode_index"]]):
            image = ds[lo + offset]["observation.images.front"]
            np.testing.assert_array_equal(
                np.rint(image.numpy() * 255).astype(np.uint8).transpose(1, 2, 0), expected
            )
    # camera stats are what lerobot's own sampling (sample_images: indices, decoding, downsampling)
    # and reduction (get_feature_stats over N, H, W, then / 255) give on the stored bytes, merged
    # with its aggregate_stats. The pixels are cast to float64 first: lerobot 0.4.4 reduces the
    # uint8 array as is, so its mean of squares wraps around and its std comes out wrong (0 here).
    # Quantiles are left out: lerobot's come from histograms, ours from a sketch.
    from lerobot.datasets.compute_stats import aggregate_stats, get_feature_stats, sample_images

    cameras = ["observation.images.front", "observation.images.wrist"]
    theirs = []
    # lerobot's metadata drops the stats/ columns when it loads episodes: read them directly
    per_episode = pq.read_table(conv.dst / "meta/episodes/chunk-000/file-000.parquet").to_pylist()
    for ep in per_episode:
        lo, hi = ep["dataset_from_index"], ep["dataset_to_index"]
        episode_stats = {}
        for name in cameras:
            sampled = sample_images([io.BytesIO(b) for b in conv.rows[name][lo:hi]])
            reduced = get_feature_stats(sampled.astype(np.float64), axis=(0, 2, 3), keepdims=True)
            episode_stats[name] = {
                k: v if k == "count" else np.squeeze(v / 255.0, axis=0) for k, v in reduced.items()
            }
            for key in ("min", "max", "mean", "std", "count"):
                np.testing.assert_allclose(
                    np.asarray(ep[f"stats/{name}/{key}"], dtype=np.float64),
                    episode_stats[name][key],
                    rtol=0,
                    atol=1e-6,
                    err_msg=f"episode {ep['episode_index']} {name} {key}",
                )
        theirs.append(episode_stats)
    aggregated = aggregate_stats(theirs)
    for name in cameras:
        for key in ("min", "max", "mean", "std", "count"):
            np.testing.assert_allclose(
                ds.meta.stats[name][key], aggregated[name][key], rtol=0, atol=1e-6, err_msg=name
            )
    # episode 3 switched task halfway and says so in its task list
    switched = next(e for e in ds.meta.episodes if len(e["tasks"]) == 2)
    assert switched["tasks"] == [GEN_TASKS[0], GEN_TASKS[1]]


def test_generated_batches_through_a_dataloader(lerobot, generated):
    conv, _ = generated
    ds = lerobot.LeRobotDataset(REPO_ID, root=conv.dst)
    loader = lerobot.torch.utils.data.DataLoader(ds, batch_size=8, shuffle=False, num_workers=0)
    batches = list(loader)
    index = np.concatenate([b["index"].numpy() for b in batches])
    np.testing.assert_array_equal(index, np.arange(conv.num_frames))
    action = np.concatenate([b["action"].numpy() for b in batches])
    np.testing.assert_array_equal(action, conv.rows["action"])
    front = np.concatenate([b["observation.images.front"].numpy() for b in batches])
    assert front.shape == (conv.num_frames, 3, FRONT[0], FRONT[1]) and front.dtype == np.float32
    tasks = [t for b in batches for t in b["task"]]
    assert tasks == [conv.tasks[t] for t in conv.rows["task_index"].tolist()]


def test_generated_delta_timestamps_respect_episode_ranges(lerobot, generated):
    """Training-time windows: lerobot clamps and pads with our dataset_from/to_index."""
    conv, _ = generated
    step = 1 / GEN_FPS
    ds = lerobot.LeRobotDataset(
        REPO_ID,
        root=conv.dst,
        delta_timestamps={"action": [-step, 0.0, step], "observation.images.front": [-step, 0.0]},
    )
    checked = 0
    for ep in conv.episodes:
        lo, hi = ep["dataset_from_index"], ep["dataset_to_index"]
        for i in (lo, lo + 1, hi - 1):
            item = ds[i]
            wanted = [min(max(i + d, lo), hi - 1) for d in (-1, 0, 1)]
            np.testing.assert_array_equal(item["action"].numpy(), conv.rows["action"][wanted])
            assert item["action_is_pad"].tolist() == [i - 1 < lo, False, i + 1 >= hi]
            assert tuple(item["observation.images.front"].shape) == (2, 3, FRONT[0], FRONT[1])
            assert item["observation.images.front_is_pad"].tolist() == [i - 1 < lo, False]
            checked += 1
    assert checked == 3 * len(conv.episodes)


def test_generated_episode_subset(lerobot, generated):
    conv, _ = generated
    chosen = [1, 4]
    ds = lerobot.LeRobotDataset(REPO_ID, root=conv.dst, episodes=chosen)
    ranges = [
        (conv.episodes[e]["dataset_from_index"], conv.episodes[e]["dataset_to_index"])
        for e in chosen
    ]
    assert ds.num_episodes == 2 and len(ds) == sum(hi - lo for lo, hi in ranges)
    got = [int(ds[j]["index"]) for j in range(len(ds))]
    assert got == [i for lo, hi in ranges for i in range(lo, hi)]
    for j in (0, len(ds) - 1):
        check_item(lerobot, conv, ds, got[j], ds[j])


@needs_corpora
def test_reachy_v30_loads_in_lerobot(lerobot, reachy):
    ds = check_dataset(lerobot, reachy, spread(reachy))
    assert ds.meta.total_frames == 899 and ds.num_episodes == 3
    # shuffled: the episodes were reordered, and the source ids are kept in the episodes file
    assert sorted(e["source_episode_index"] for e in reachy.episodes) == [0, 1, 2]
    assert ds.meta.tasks.index.tolist() == ["place the apple in the plate"]


@needs_corpora
def test_unitree_v21_without_videos_loads_in_lerobot(lerobot, unitree):
    ds = check_dataset(lerobot, unitree, spread(unitree))
    assert ds.meta.total_frames == 35965 and ds.num_episodes == 100
    assert "observation.images.cam_high" not in ds.features
    assert ds.meta.info["video_path"] is None
    files = {(e["data/chunk_index"], e["data/file_index"]) for e in ds.meta.episodes}
    assert len(files) == unitree.num_shards


def test_two_dimensional_tensor_feature_loads_in_lerobot(lerobot, tmp_path):
    """A (2, 3) float feature: lerobot reads it as datasets.Array2D (storage list<list<float>>)."""
    spec = FeatureSpec(
        (
            Feature("observation.grid", "float32", (2, 3)),
            Feature("timestamp", "float32"),
            Feature("frame_index", "int64"),
            Feature("episode_index", "int64"),
            Feature("index", "int64"),
            Feature("task_index", "int64"),
        )
    )
    n = 6
    grid = np.arange(n * 6, dtype=np.float32).reshape(n, 2, 3)
    data = {
        "observation.grid": grid,
        "timestamp": np.r_[np.arange(2), np.arange(4)].astype(np.float32) / 10,
        "frame_index": np.r_[np.arange(2), np.arange(4)],
        "episode_index": np.r_[[0] * 2, [1] * 4],
        "index": np.arange(n),
        "task_index": np.zeros(n, dtype=np.int64),
    }
    write_dataset(tmp_path / "ds", spec, data, tasks=["t"], fps=10)
    ds = lerobot.LeRobotDataset(REPO_ID, root=tmp_path / "ds")
    np.testing.assert_array_equal(ds[3]["observation.grid"].numpy(), grid[3])
    check_hf_features(lerobot, ds, tmp_path / "ds")
