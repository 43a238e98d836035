"""LeRobot videos through `shardfeed convert`: v2.1 per-episode MP4s -> v3.0 files per shard, and
v3.0 -> v3.0 re-sharding, on generated fixtures and on 3 real episodes of the unitree corpus
(``$SHARDFEED_CORPORA/lerobot_v21_unitree_g1``, AV1 640x480, copied into tmp_path)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

pytest.importorskip("apache_beam")
pytest.importorskip("av")

import av
from video_fixtures import FPS, decoded, encode, frame_pixels

from shardfeed import open_dataset
from shardfeed.cli.main import main
from shardfeed.formats.sources.lerobot import LeRobotSource
from shardfeed.formats.storage import locate
from shardfeed.formats.verify import verify_dataset
from shardfeed.formats.video import probe
from shardfeed.schemas.errors import ShardfeedError

CORPORA = os.environ.get("SHARDFEED_CORPORA")
UNITREE = Path(CORPORA or "", "lerobot_v21_unitree_g1")
needs_corpora = pytest.mark.skipif(
    not CORPORA, reason="SHARDFEED_CORPORA is not set (scripts/test.sh sets it)"
)

CAM = "observation.images.cam"
V21_DATA = "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet"
V21_VIDEO = "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4"
LENGTHS = {0: 5, 1: 7, 2: 4, 3: 6, 4: 3}
FEATURES = {
    "observation.state": {"dtype": "float32", "shape": [2], "names": None},
    CAM: {
        "dtype": "video",
        "shape": [16, 32, 3],
        "names": ["height", "width", "channel"],
        "info": {"video.fps": FPS, "video.codec": "h264", "video.is_depth_map": False},
    },
    "timestamp": {"dtype": "float32", "shape": [1], "names": None},
    "frame_index": {"dtype": "int64", "shape": [1], "names": None},
    "episode_index": {"dtype": "int64", "shape": [1], "names": None},
    "index": {"dtype": "int64", "shape": [1], "names": None},
    "task_index": {"dtype": "int64", "shape": [1], "names": None},
}


# ---- fixtures --------------------------------------------------------------------------------


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def make_v21_with_videos(root: Path, lengths: dict[int, int] = LENGTHS) -> Path:
    """A v2.1 dataset: one Parquet file and one MP4 per episode, at 10 fps."""
    first = 0
    for ep, n in sorted(lengths.items()):
        rng = np.random.default_rng(ep)
        table = pa.table(
            {
                "observation.state": pa.FixedSizeListArray.from_arrays(
                    pa.array(rng.normal(size=2 * n).astype(np.float32)), 2
                ),
                "timestamp": pa.array(np.arange(n, dtype=np.float32) / FPS),
                "frame_index": pa.array(np.arange(n, dtype=np.int64)),
                "episode_index": pa.array(np.full(n, ep, dtype=np.int64)),
                "index": pa.array(np.arange(first, first + n, dtype=np.int64)),
                "task_index": pa.array(np.zeros(n, dtype=np.int64)),
            }
        )
        first += n
        path = root / V21_DATA.format(episode_chunk=0, episode_index=ep)
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, path)
        video = V21_VIDEO.format(episode_chunk=0, video_key=CAM, episode_index=ep)
        encode(root / video, [frame_pixels(ep, i) for i in range(n)], gop=4)
    info = {
        "codebase_version": "v2.1",
        "robot_type": "toy",
        "total_episodes": len(lengths),
        "total_frames": sum(lengths.values()),
        "total_tasks": 1,
        "total_videos": len(lengths),
        "total_chunks": 1,
        "chunks_size": 1000,
        "fps": FPS,
        "splits": {"train": f"0:{len(lengths)}"},
        "data_path": V21_DATA,
        "video_path": V21_VIDEO,
        "features": FEATURES,
    }
    (root / "meta").mkdir(parents=True, exist_ok=True)
    (root / "meta/info.json").write_text(json.dumps(info, indent=4))
    write_jsonl(
        root / "meta/episodes.jsonl",
        [
            {"episode_index": ep, "tasks": ["wave"], "length": n}
            for ep, n in sorted(lengths.items())
        ],
    )
    write_jsonl(root / "meta/tasks.jsonl", [{"task_index": 0, "task": "wave"}])
    write_jsonl(
        root / "meta/episodes_stats.jsonl",
        [{"episode_index": ep, "stats": {}} for ep in sorted(lengths)],
    )
    return root


def tree(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def frame_at(frames: list[tuple[float, np.ndarray]], t: float) -> np.ndarray:
    """The frame LeRobot returns for query time ``t`` (nearest, within its 1e-4 s tolerance)."""
    times = np.array([ts for ts, _ in frames])
    i = int(np.argmin(np.abs(times - t)))
    assert abs(times[i] - t) < 1e-4, (t, times[i])
    return frames[i][1]


def episodes_meta(dst: Path) -> list[dict]:
    return pq.read_table(dst / "meta/episodes/chunk-000/file-000.parquet").to_pylist()


def video_file(dst: Path, key: str, episode: dict) -> Path:
    chunk = episode[f"videos/{key}/chunk_index"]
    number = episode[f"videos/{key}/file_index"]
    return dst / f"videos/{key}/chunk-{chunk:03d}/file-{number:03d}.mp4"


def check_frames(dst: Path, source_frames: dict[int, list[np.ndarray]], key: str = CAM) -> None:
    """Each episode's frame k is at from_timestamp + timestamp[k] in its file (LeRobot's lookup),
    and equals the source episode's frame k; every file holds exactly its episodes' frames."""
    episodes = episodes_meta(dst)
    data = open_dataset(dst).read(0, sum(e["length"] for e in episodes))
    by_file: dict[Path, list[dict]] = {}
    for ep in episodes:
        by_file.setdefault(video_file(dst, key, ep), []).append(ep)
    for path, members in by_file.items():
        # the video has the shard's chunk and file numbers, and the shard's episodes
        assert {(e["data/chunk_index"], e["data/file_index"]) for e in members} == {
            (e[f"videos/{key}/chunk_index"], e[f"videos/{key}/file_index"]) for e in members
        }
        assert probe(locate(dst), str(path.relative_to(dst))).frames == sum(
            e["length"] for e in members
        )
        frames = decoded(path)
        assert len(frames) == sum(e["length"] for e in members)
        previous_end = 0.0
        for ep in sorted(members, key=lambda e: e["dataset_from_index"]):
            start, end = ep[f"videos/{key}/from_timestamp"], ep[f"videos/{key}/to_timestamp"]
            assert start == pytest.approx(previous_end, abs=1e-12)
            assert end - start == pytest.approx(ep["length"] / FPS, abs=1e-9)
            previous_end = end
            timestamps = data["timestamp"][ep["dataset_from_index"] : ep["dataset_to_index"]]
            expected = source_frames[ep["source_episode_index"]]
            assert len(expected) == ep["length"] == len(timestamps)
            for k, ts in enumerate(timestamps.reshape(-1).tolist()):
                np.testing.assert_array_equal(frame_at(frames, start + ts), expected[k])


def source_frames_v21(
    src: Path, episodes: tuple[int, ...] = tuple(LENGTHS)
) -> dict[int, list[np.ndarray]]:
    return {
        ep: [
            pixels
            for _, pixels in decoded(
                src / V21_VIDEO.format(episode_chunk=0, video_key=CAM, episode_index=ep)
            )
        ]
        for ep in episodes
    }


@pytest.fixture
def v21(tmp_path: Path) -> Path:
    return make_v21_with_videos(tmp_path / "src")


# ---- generated data ----------------------------------------------------------------------------


def test_v21_videos_become_one_file_per_shard_with_exact_timestamps(tmp_path, v21, capsys):
    dst = tmp_path / "out"
    assert main(["convert", str(v21), str(dst), "--target-shard-size", "150B", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["samples_out"] == sum(LENGTHS.values()) and summary["rejects"]["total"] == 0
    assert summary["shards"] >= 3
    assert not any("dropped" in note for note in summary["notes"])
    videos = sorted(p.relative_to(dst).as_posix() for p in (dst / "videos").rglob("*.mp4"))
    assert videos == [f"videos/{CAM}/chunk-000/file-{n:03d}.mp4" for n in range(summary["shards"])]
    check_frames(dst, source_frames_v21(v21))

    # episode metadata: LeRobot v3.0's video columns, after dataset_to_index, with its dtypes
    table = pq.read_table(dst / "meta/episodes/chunk-000/file-000.parquet")
    names = table.column_names
    prefix = f"videos/{CAM}/"
    assert names[5:9] == [
        prefix + "chunk_index",
        prefix + "file_index",
        prefix + "from_timestamp",
        prefix + "to_timestamp",
    ]
    assert [table.schema.field(n).type for n in names[5:9]] == [
        pa.int64(),
        pa.int64(),
        pa.float64(),
        pa.float64(),
    ]

    # info.json keeps the feature, with info from the files, and names the video path
    info = json.loads((dst / "meta/info.json").read_text())
    assert (
        info["video_path"] == "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
    )
    assert info["features"][CAM]["info"] == {
        "video.fps": FPS,
        "video.codec": "mpeg4",  # the source info.json said h264; the files say mpeg4
        "video.is_depth_map": False,
        "video.height": 16,
        "video.width": 32,
        "video.pix_fmt": "yuv420p",
        "has_audio": False,
    }
    assert list(info["features"]) == list(FEATURES)

    # the manifest vouches for every video; verify checks them and flags a flipped byte
    manifest = json.loads((dst / "meta/shardfeed/manifest.json").read_text())
    assert set(videos) <= {f["path"] for f in manifest["files"]}
    assert verify_dataset(dst).ok
    victim = dst / videos[1]
    blob = bytearray(victim.read_bytes())
    blob[len(blob) // 2] ^= 0xFF
    victim.write_bytes(bytes(blob))
    report = verify_dataset(dst)
    assert not report.ok and any(p.path == videos[1] for p in report.problems)
    assert main(["verify", str(dst)]) == 1


def test_video_output_is_byte_identical_across_runs_and_running_modes(tmp_path, v21):
    first, second = tmp_path / "a", tmp_path / "b"
    args = ["--target-shard-size", "150B"]
    assert main(["convert", str(v21), str(first), *args]) == 0
    assert (
        main(
            [
                "convert",
                str(v21),
                str(second),
                *args,
                "--direct_running_mode=multi_processing",
                "--direct_num_workers=2",
            ]
        )
        == 0
    )
    a, b = tree(first), tree(second)
    assert any(name.endswith(".mp4") for name in a)
    assert a == b


def test_v30_source_with_videos_is_resharded(tmp_path, v21):
    """A v3.0 dataset (our own output, several episodes per MP4) converted again into other shards."""
    middle, final = tmp_path / "v30", tmp_path / "resharded"
    assert main(["convert", str(v21), str(middle), "--target-shard-size", "400B"]) == 0
    before = episodes_meta(middle)
    assert max(e[f"videos/{CAM}/from_timestamp"] for e in before) > 0  # files hold several episodes
    assert (
        main(
            [
                "convert",
                str(middle),
                str(final),
                "--target-shard-size",
                "150B",
                "--shuffle-seed",
                "3",
            ]
        )
        == 0
    )
    after = episodes_meta(final)
    assert len({video_file(final, CAM, e) for e in after}) > len(
        {video_file(middle, CAM, e) for e in before}
    )
    # chain the source ids back to the v2.1 episodes, then check every frame
    original = {e["episode_index"]: e["source_episode_index"] for e in before}
    frames = source_frames_v21(v21)
    check_frames(final, {mid: frames[src] for mid, src in original.items()})
    assert verify_dataset(final).ok


def test_missing_mp4_is_a_clear_error_and_drop_videos_still_works(tmp_path, v21, capsys):
    (v21 / V21_VIDEO.format(episode_chunk=0, video_key=CAM, episode_index=3)).unlink()
    dst = tmp_path / "out"
    assert main(["convert", str(v21), str(dst)]) == 1
    err = capsys.readouterr().err
    assert "missing 1 of its 5 MP4 files" in err and "episode_000003.mp4" in err
    assert "--drop-videos" in err and "Traceback" not in err
    assert not (dst / "meta/shardfeed/manifest.json").exists()

    assert main(["convert", str(v21), str(dst), "--drop-videos", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert f"video feature '{CAM}' dropped (--drop-videos)" in summary["notes"]
    assert not (dst / "videos").exists()
    info = json.loads((dst / "meta/info.json").read_text())
    assert CAM not in info["features"] and info["video_path"] is None
    assert not [c for c in episodes_meta(dst)[0] if c.startswith("videos/")]
    assert verify_dataset(dst).ok


def rejects_json(dst: Path, capsys) -> dict:
    capsys.readouterr()
    assert main(["rejects", "--json", str(dst)]) == 0
    return json.loads(capsys.readouterr().out)


def test_an_mp4_with_the_wrong_frame_count_rejects_its_episode(tmp_path, v21, capsys):
    video = v21 / V21_VIDEO.format(episode_chunk=0, video_key=CAM, episode_index=2)
    encode(video, [frame_pixels(2, i) for i in range(LENGTHS[2] + 2)], gop=4)
    # 1 of 5 episodes is over the default --max-reject-fraction: nothing is published
    dst = tmp_path / "out"
    assert main(["convert", str(v21), str(dst)]) == 1
    err = capsys.readouterr().err
    assert "1 of 5 records rejected" in err and "nothing was published" in err
    assert "video_mismatch" in err and "Traceback" not in err
    assert not (dst / "meta/shardfeed/manifest.json").exists()
    assert not (dst / "meta/shardfeed/rejects").exists()

    args = ["--target-shard-size", "150B", "--max-reject-fraction", "0.5", "--json"]
    assert main(["convert", str(v21), str(dst), *args]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["rejects"] == {"total": 1, "by_reason": {"video_mismatch": 1}}
    assert summary["samples_out"] == sum(n for ep, n in LENGTHS.items() if ep != 2)
    [reject] = rejects_json(dst, capsys)["rejects"]
    assert reject["source"] == V21_DATA.format(episode_chunk=0, episode_index=2)
    assert (reject["position"], reject["reason"]) == ("episode:2", "video_mismatch")
    assert "episode_000002.mp4 holds 6 frames" in reject["message"]
    assert "episode 2 has 4 rows" in reject["message"]
    assert sorted(e["source_episode_index"] for e in episodes_meta(dst)) == [0, 1, 3, 4]
    check_frames(dst, source_frames_v21(v21))
    assert verify_dataset(dst).ok


def test_a_corrupt_mp4_and_an_incompatible_mp4_reject_their_episodes(tmp_path, v21, capsys):
    """Episode 0's MP4 is random bytes (so episode 1's is the reference); episode 3's is twice as
    wide, so its packets cannot share a stream with the others'."""
    junk = v21 / V21_VIDEO.format(episode_chunk=0, video_key=CAM, episode_index=0)
    junk.write_bytes(np.random.default_rng(0).bytes(4096))
    wide = v21 / V21_VIDEO.format(episode_chunk=0, video_key=CAM, episode_index=3)
    encode(wide, [np.tile(frame_pixels(3, i), (1, 2, 1)) for i in range(LENGTHS[3])], gop=4)
    dst = tmp_path / "out"
    args = ["--target-shard-size", "150B", "--max-reject-fraction", "0.5", "--json"]
    assert main(["convert", str(v21), str(dst), *args]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["rejects"] == {
        "total": 2,
        "by_reason": {"video_corrupt": 1, "video_incompatible": 1},
    }
    listing = rejects_json(dst, capsys)
    by_position = {r["position"]: r for r in listing["rejects"]}
    assert set(by_position) == {"episode:0", "episode:3"}
    corrupt, incompatible = by_position["episode:0"], by_position["episode:3"]
    assert corrupt["source"] == V21_DATA.format(episode_chunk=0, episode_index=0)
    assert corrupt["reason"] == "video_corrupt"
    assert "episode_000000.mp4: not a readable video file" in corrupt["message"]
    assert incompatible["source"] == V21_DATA.format(episode_chunk=0, episode_index=3)
    assert incompatible["reason"] == "video_incompatible"
    assert "episode_000003.mp4: width is 64 but" in incompatible["message"]
    assert "episode_000001.mp4, the reference video" in incompatible["message"]
    assert sorted(e["source_episode_index"] for e in episodes_meta(dst)) == [1, 2, 4]
    frames = source_frames_v21(v21, episodes=(1, 2, 4))
    check_frames(dst, frames)
    info = json.loads((dst / "meta/info.json").read_text())
    assert info["features"][CAM]["info"]["video.width"] == 32
    assert verify_dataset(dst).ok


def test_a_v30_range_that_does_not_start_on_a_keyframe_rejects_its_episode(tmp_path, v21, capsys):
    """Re-sharding a v3.0 dataset whose metadata moves one episode's range by a frame: the same
    frame count, but it no longer starts on a keyframe, so it cannot be stream-copied."""
    middle = tmp_path / "v30"
    assert main(["convert", str(v21), str(middle), "--target-shard-size", "400B"]) == 0
    episodes = middle / "meta/episodes/chunk-000/file-000.parquet"
    table = pq.read_table(episodes)
    rows = table.to_pylist()

    def moved_start_is_not_a_keyframe(row: dict) -> bool:
        """Whether the frame after the row's first is not a keyframe, and not past the file's end."""
        with av.open(str(video_file(middle, CAM, row))) as container:
            stream = container.streams.video[0]
            time_base = stream.time_base  # PyAV 18.1.1 refuses a closed container's streams
            keys = {p.pts: p.is_keyframe for p in container.demux(stream) if p.size}
        start = round((row[f"videos/{CAM}/from_timestamp"] + 1 / FPS) / time_base)
        end = round(row[f"videos/{CAM}/to_timestamp"] / time_base)
        return keys.get(start) is False and end in keys

    victim = next(i for i, row in enumerate(rows) if moved_start_is_not_a_keyframe(row))
    for name in ("from_timestamp", "to_timestamp"):
        column = table.column(f"videos/{CAM}/{name}").to_pylist()
        column[victim] += 1 / FPS
        index = table.column_names.index(f"videos/{CAM}/{name}")
        table = table.set_column(index, f"videos/{CAM}/{name}", pa.array(column, pa.float64()))
    pq.write_table(table, episodes)
    capsys.readouterr()
    final = tmp_path / "final"
    args = ["--max-reject-fraction", "0.5", "--json"]
    assert main(["convert", str(middle), str(final), *args]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["rejects"] == {"total": 1, "by_reason": {"video_incompatible": 1}}
    [reject] = rejects_json(final, capsys)["rejects"]
    assert reject["position"] == f"episode:{rows[victim]['episode_index']}"
    assert "does not start on a keyframe" in reject["message"]
    assert verify_dataset(final).ok


def test_source_keeps_video_features_and_refreshes_their_info(v21):
    source = LeRobotSource(v21)
    assert CAM in source.spec() and source.dropped_videos == []
    assert source.spec()[CAM].extra["info"]["video.codec"] == "mpeg4"
    assert source.spec()[CAM].extra["info"]["video.is_depth_map"] is False  # kept from info.json
    # an unreadable first MP4 is skipped (scan rejects its episode): the next one is the reference
    (v21 / V21_VIDEO.format(episode_chunk=0, video_key=CAM, episode_index=0)).write_bytes(b"junk")
    assert LeRobotSource(v21).spec()[CAM].extra["info"]["video.codec"] == "mpeg4"
    for ep in LENGTHS:
        (v21 / V21_VIDEO.format(episode_chunk=0, video_key=CAM, episode_index=ep)).write_bytes(b"x")
    with pytest.raises(ShardfeedError, match=r"no MP4 of video feature .* is readable"):
        LeRobotSource(v21)


def test_v30_source_needs_timestamps_and_file_names_to_find_frames(tmp_path, v21):
    dst = tmp_path / "v30"
    assert main(["convert", str(v21), str(dst), "--target-shard-size", "400B"]) == 0
    assert CAM in LeRobotSource(dst).spec()
    episodes = dst / "meta/episodes/chunk-000/file-000.parquet"
    table = pq.read_table(episodes)
    # without from/to timestamps the frames of an episode cannot be found in a shared MP4
    pq.write_table(table.drop_columns([f"videos/{CAM}/from_timestamp"]), episodes)
    with pytest.raises(ShardfeedError, match=r"no videos/observation\.images\.cam/from_timestamp"):
        LeRobotSource(dst)
    assert CAM not in LeRobotSource(dst, drop_videos=True).spec()
    # without file numbers the metadata does not say which MP4 holds an episode
    pq.write_table(
        table.drop_columns([f"videos/{CAM}/chunk_index", f"videos/{CAM}/file_index"]), episodes
    )
    with pytest.raises(ShardfeedError, match="does not say which file holds which episode"):
        LeRobotSource(dst)


# ---- real data: 3 episodes of the unitree corpus with their AV1 MP4s ------------------------------


def unitree_subset(root: Path, episodes: tuple[int, ...] = (1, 2, 4)) -> Path:
    """A v2.1 dataset of the corpus episodes that have MP4s, copied into ``root``."""
    key = "observation.images.cam_high"
    for ep in episodes:
        for rel in (
            V21_DATA.format(episode_chunk=0, episode_index=ep),
            V21_VIDEO.format(episode_chunk=0, video_key=key, episode_index=ep),
        ):
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(UNITREE / rel, root / rel)
    (root / "meta").mkdir(parents=True)
    shutil.copyfile(UNITREE / "meta/tasks.jsonl", root / "meta/tasks.jsonl")
    kept = {}
    for name in ("episodes.jsonl", "episodes_stats.jsonl"):
        lines = [
            line
            for line in (UNITREE / "meta" / name).read_text().splitlines()
            if json.loads(line)["episode_index"] in episodes
        ]
        (root / "meta" / name).write_text("\n".join(lines) + "\n")
        if name == "episodes.jsonl":
            kept = {json.loads(line)["episode_index"]: json.loads(line)["length"] for line in lines}
    info = json.loads((UNITREE / "meta/info.json").read_text())
    info.update(
        total_episodes=len(episodes),
        total_frames=sum(kept.values()),
        total_videos=len(episodes),
        splits={"train": f"0:{len(episodes)}"},
    )
    (root / "meta/info.json").write_text(json.dumps(info, indent=4))
    return root


@needs_corpora
def test_unitree_episodes_with_av1_videos(tmp_path, capsys):
    key = "observation.images.cam_high"
    src = unitree_subset(tmp_path / "src")
    dst = tmp_path / "out"
    assert main(["convert", str(src), str(dst), "--no-shuffle", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["samples_out"] == 393 + 343 + 357 and summary["notes"] == []
    episodes = episodes_meta(dst)
    assert [(e["source_episode_index"], e["length"]) for e in episodes] == [
        (1, 393),
        (2, 343),
        (4, 357),
    ]
    # one shard: the three episodes back to back, in source order, at 30 fps
    assert {video_file(dst, key, e) for e in episodes} == {
        dst / f"videos/{key}/chunk-000/file-000.mp4"
    }
    bounds = [0.0, 393 / 30, (393 + 343) / 30, (393 + 343 + 357) / 30]
    for e, lo, hi in zip(episodes, bounds, bounds[1:], strict=False):
        assert e[f"videos/{key}/from_timestamp"] == pytest.approx(lo, abs=1e-9)
        assert e[f"videos/{key}/to_timestamp"] == pytest.approx(hi, abs=1e-9)
    out = probe(locate(dst), f"videos/{key}/chunk-000/file-000.mp4")
    assert (out.codec, out.width, out.height, out.frames) == ("av1", 640, 480, 393 + 343 + 357)
    # stream copy: the output's packets are the three sources' packets, in order
    with av.open(str(dst / f"videos/{key}/chunk-000/file-000.mp4")) as container:
        stream = container.streams.video[0]
        copied = [(p.pts, bytes(p)) for p in container.demux(stream) if p.size]
    expected = []
    for e, lo in zip(episodes, bounds, strict=False):
        rel = V21_VIDEO.format(
            episode_chunk=0, video_key=key, episode_index=e["source_episode_index"]
        )
        with av.open(str(src / rel)) as container:
            stream = container.streams.video[0]
            offset = round(lo / stream.time_base)
            expected += [(offset + p.pts, bytes(p)) for p in container.demux(stream) if p.size]
    assert copied == expected
    info = json.loads((dst / "meta/info.json").read_text())["features"][key]["info"]
    assert info["video.codec"] == "av1" and info["video.fps"] == 30
    assert verify_dataset(dst).ok

    # and per-episode shards: each episode's video starts at 0 in its own file
    per_episode = tmp_path / "split"
    assert main(["convert", str(src), str(per_episode), "--target-shard-size", "60KB"]) == 0
    split = episodes_meta(per_episode)
    assert len({video_file(per_episode, key, e) for e in split}) == 3
    for e in split:
        assert e[f"videos/{key}/from_timestamp"] == 0.0
        assert e[f"videos/{key}/to_timestamp"] == pytest.approx(e["length"] / 30, abs=1e-9)
        path = video_file(per_episode, key, e)
        assert probe(locate(per_episode), str(path.relative_to(per_episode))).frames == e["length"]


def interrupted_convert(monkeypatch, argv: list[str], after: int = 2) -> None:
    """Run ``convert ARGV`` and crash it as its shard writer starts shard ``after + 1``: a run that
    finished ``after`` shards and left its work behind, for a re-run to take over. The crash
    point is counted in write order, so this run writes on one thread."""
    import shardfeed.pipelines.convert as graph

    real_build_shard, calls = graph.build_shard, []

    def crash(root, number, *a, **kw):
        calls.append(number)
        if len(calls) == after + 1:
            raise RuntimeError("simulated crash")
        return real_build_shard(root, number, *a, **kw)

    monkeypatch.setattr(graph, "build_shard", crash)
    with pytest.raises(Exception, match="simulated crash"):
        main(["convert", *argv, "--direct_num_workers=1"])
    monkeypatch.undo()


def test_a_rerun_rewrites_shard_videos_whose_source_mp4_changed(tmp_path, v21, monkeypatch):
    """A re-run may reuse an interrupted run's shards, but never a video cut from a changed MP4."""
    args = ["--target-shard-size", "150B"]
    dst = tmp_path / "dst"
    interrupted_convert(monkeypatch, [str(v21), str(dst), *args])
    assert len(list((dst / "videos").rglob("*.mp4"))) == 2  # two shards finished
    # every source MP4 changes (same frame count, other pixels) before the re-run
    for ep, n in LENGTHS.items():
        video = V21_VIDEO.format(episode_chunk=0, video_key=CAM, episode_index=ep)
        encode(v21 / video, [255 - frame_pixels(ep, i) for i in range(n)], gop=4)
    assert main(["convert", str(v21), str(dst), *args]) == 0
    clean = tmp_path / "clean"
    assert main(["convert", str(v21), str(clean), *args]) == 0
    assert tree(dst) == tree(clean)
