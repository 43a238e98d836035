"""Camera stats of ``image`` features: LeRobot's per-channel (3, 1, 1) stats over sampled frames.

The reference values are computed here with numpy from the generated pixels, with the sampling and
downsampling rules written out independently of ``formats/image_stats.py``.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from shardfeed import write_dataset
from shardfeed.cli.main import main
from shardfeed.formats.image_stats import estimate_num_samples, sample_indices
from shardfeed.schemas.errors import ShardfeedError

STAT_KEYS = ["min", "max", "mean", "std", "count", "q01", "q10", "q50", "q90", "q99"]
# (frames, height, width): a short episode, one long enough to be sampled (150 -> 100 frames), and
# one whose frames are large enough to be downsampled (320 px wide -> every 2nd pixel)
EPISODES = [(5, 4, 6), (150, 6, 5), (7, 200, 320)]
CAMERA = "observation.images.cam"


def _pixels(episode: int, frame: int, height: int, width: int) -> np.ndarray:
    """A deterministic RGB frame whose channels differ and vary with position and frame."""
    rows, cols = np.mgrid[0:height, 0:width]
    channels = [(rows * 7 + cols * 3 + frame * 5 + episode * 11 + c * 60) % 256 for c in range(3)]
    return np.stack(channels, axis=-1).astype(np.uint8)


def _png(pixels: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return buf.getvalue()


def _expected_sample(n: int) -> list[int]:
    """LeRobot's rule, restated: all frames up to 100, else max(100, int(n**0.75)) evenly spaced."""
    k = n if n < 100 else max(100, min(int(n**0.75), 10_000))
    return np.round(np.linspace(0, n - 1, k)).astype(int).tolist()


def _expected_pixels(episode: int) -> tuple[np.ndarray, int]:
    """The sampled, downsampled pixels of one episode as (pixels, 3) in [0, 1], and the frame count."""
    frames, height, width = EPISODES[episode]
    step = 1
    if max(height, width) >= 300:
        step = int(max(height, width) / 150)
    chosen = _expected_sample(frames)
    pixels = [_pixels(episode, f, height, width)[::step, ::step].reshape(-1, 3) for f in chosen]
    return np.concatenate(pixels).astype(np.float64) / 255.0, len(chosen)


def _dataset_rows() -> dict[str, list]:
    rows: dict[str, list] = {
        CAMERA: [],
        "observation.state": [],
        "episode_index": [],
        "frame_index": [],
        "index": [],
        "task_index": [],
    }
    index = 0
    for episode, (frames, height, width) in enumerate(EPISODES):
        for frame in range(frames):
            rows[CAMERA].append(_png(_pixels(episode, frame, height, width)))
            rows["observation.state"].append([float(frame), float(episode) / 3])
            rows["episode_index"].append(episode)
            rows["frame_index"].append(frame)
            rows["index"].append(index)
            rows["task_index"].append(0)
            index += 1
    return rows


FEATURES = {
    CAMERA: {"dtype": "image", "shape": [200, 320, 3], "names": ["height", "width", "channel"]},
    "observation.state": {"dtype": "float32", "shape": [2], "names": None},
    "episode_index": {"dtype": "int64", "shape": [1], "names": None},
    "frame_index": {"dtype": "int64", "shape": [1], "names": None},
    "index": {"dtype": "int64", "shape": [1], "names": None},
    "task_index": {"dtype": "int64", "shape": [1], "names": None},
}


def _write(root: Path, rows: dict[str, list], **kwargs) -> None:
    write_dataset(root, FEATURES, rows, tasks=["look"], fps=10, **kwargs)


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("img") / "ds"
    _write(root, _dataset_rows(), target_shard_size="1KB")  # one shard per episode
    manifest = json.loads((root / "meta/shardfeed/manifest.json").read_text())
    assert len(manifest["shards"]) == len(EPISODES)
    return root


def _check(stats: dict, pixels: np.ndarray, frames: int, exact_quantiles: bool) -> None:
    assert list(stats) == STAT_KEYS
    for key in STAT_KEYS:
        if key != "count":
            assert np.array(stats[key]).shape == (3, 1, 1), key
    assert stats["count"] == [frames]
    for key, fn in {"min": np.min, "max": np.max, "mean": np.mean, "std": np.std}.items():
        np.testing.assert_allclose(
            np.array(stats[key]).reshape(3), fn(pixels, axis=0), rtol=0, atol=1e-6, err_msg=key
        )
    quantiles = {k: np.array(stats[k]).reshape(3) for k in STAT_KEYS[5:]}
    assert np.all(quantiles["q01"] <= quantiles["q50"]) and np.all(
        quantiles["q50"] <= quantiles["q99"]
    )
    if exact_quantiles:  # up to 2048 values per channel, the sketch is exact
        for key, q in {"q01": 0.01, "q50": 0.5, "q99": 0.99}.items():
            np.testing.assert_array_equal(
                quantiles[key], np.quantile(pixels, q, axis=0, method="inverted_cdf")
            )


def test_sampling_rule_matches_lerobot() -> None:
    for n in (1, 2, 5, 99, 100, 150, 501, 1000, 20_000, 10**6):
        assert sample_indices(n).tolist() == _expected_sample(n)
    assert estimate_num_samples(1000) == 177 and estimate_num_samples(10**6) == 10_000


def test_stats_json_has_camera_stats(written: Path) -> None:
    stats = json.loads((written / "meta/stats.json").read_text())
    assert list(stats) == list(FEATURES)  # feature order, the camera included
    parts = [_expected_pixels(e) for e in range(len(EPISODES))]
    pixels = np.concatenate([p for p, _ in parts])
    _check(stats[CAMERA], pixels, sum(n for _, n in parts), exact_quantiles=False)
    # same key set and nesting as the camera entry of a real LeRobot v3.0 stats.json
    reachy = {
        "min": [[[0.0]], [[0.0]], [[0.0]]],
        "max": [[[1.0]], [[1.0]], [[1.0]]],
        "count": [300],
    }
    for key, value in reachy.items():
        assert np.array(stats[CAMERA][key]).shape == np.array(value).shape


def test_numeric_stats_are_untouched(written: Path) -> None:
    stats = json.loads((written / "meta/stats.json").read_text())
    rows = _dataset_rows()
    state = np.asarray(rows["observation.state"], dtype=np.float32)
    assert stats["observation.state"]["count"] == [len(state)]
    np.testing.assert_array_equal(stats["observation.state"]["min"], state.min(axis=0))
    np.testing.assert_allclose(stats["observation.state"]["mean"], state.astype(float).mean(0))


def test_episodes_parquet_has_camera_columns(written: Path) -> None:
    table = pq.read_table(written / "meta/episodes/chunk-000/file-000.parquet")
    nested = pa.list_(pa.list_(pa.list_(pa.float64())))
    for key in STAT_KEYS:
        column = f"stats/{CAMERA}/{key}"
        assert table.schema.field(column).type == (
            pa.list_(pa.int64()) if key == "count" else nested
        ), column
    # camera columns come in feature order, before the numeric features that follow it
    names = [n for n in table.column_names if n.startswith("stats/")]
    assert names.index(f"stats/{CAMERA}/min") < names.index("stats/observation.state/min")
    for episode in range(len(EPISODES)):
        pixels, frames = _expected_pixels(episode)
        stats = {key: table.column(f"stats/{CAMERA}/{key}")[episode].as_py() for key in STAT_KEYS}
        _check(stats, pixels, frames, exact_quantiles=len(pixels) <= 2048)


def test_image_stats_are_deterministic(written: Path, tmp_path: Path) -> None:
    again = tmp_path / "again"
    _write(again, _dataset_rows(), target_shard_size="1KB")
    for rel in ("meta/stats.json", "meta/episodes/chunk-000/file-000.parquet"):
        assert (again / rel).read_bytes() == (written / rel).read_bytes(), rel


def test_shard_split_does_not_change_stats(written: Path, tmp_path: Path) -> None:
    one = tmp_path / "one"
    _write(one, _dataset_rows(), target_shard_size="100MB")
    assert json.loads((one / "meta/stats.json").read_text()) == json.loads(
        (written / "meta/stats.json").read_text()
    )


def test_convert_keeps_camera_stats(written: Path, tmp_path: Path) -> None:
    dst = tmp_path / "converted"
    assert main(["convert", str(written), str(dst)]) == 0
    ours = json.loads((dst / "meta/stats.json").read_text())
    assert ours[CAMERA] == json.loads((written / "meta/stats.json").read_text())[CAMERA]


def test_undecodable_frame_names_the_episode(tmp_path: Path) -> None:
    rows = _dataset_rows()
    rows[CAMERA][5 + 3] = b"\x89PNG\r\n\x1a\n not really a png"  # episode 1, frame 3 (sampled)
    with pytest.raises(ShardfeedError, match=r"episode 1: the frame at index 8 does not decode"):
        _write(tmp_path / "bad", rows)


def test_null_frames_are_skipped(tmp_path: Path) -> None:
    """Null images are not sampled; an episode with none gets null stats, not a crash."""
    rows = _dataset_rows()
    for i in range(5):  # all of episode 0
        rows[CAMERA][i] = None
    rows[CAMERA][5] = None  # the first frame of episode 1
    _write(tmp_path / "ds", rows, target_shard_size="1KB")
    table = pq.read_table(tmp_path / "ds/meta/episodes/chunk-000/file-000.parquet")
    assert table.column(f"stats/{CAMERA}/count").to_pylist() == [None, [100], [7]]
    assert table.column(f"stats/{CAMERA}/mean")[0].as_py() is None
    stats = json.loads((tmp_path / "ds/meta/stats.json").read_text())
    assert stats[CAMERA]["count"] == [107]
    assert stats["observation.state"]["count"] == [len(rows["index"])]
