"""LeRobotSource: v2.1 and v3.0 datasets read by episode, on generated fixtures and the real corpora.

The corpus tests run over ``$SHARDFEED_CORPORA`` (scripts/test.sh sets it): ``lerobot_v21_unitree_g1``
(100 episodes, 35,965 frames, 3 of 100 MP4s present) and ``lerobot_v30_reachy2_apple_storage``
(3 episodes, 899 frames, no MP4, info.json claims 14,983 frames).
"""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shardfeed.formats.sources.base import UnitRef
from shardfeed.formats.sources.lerobot import (
    LeRobotSource,
    lerobot_codebase_version,
    table_hash,
)
from shardfeed.formats.sources.lerobot_v21 import parse_episodes_jsonl, parse_tasks_jsonl
from shardfeed.schemas.errors import SchemaError, ShardfeedError
from shardfeed.schemas.features import IMAGE_ARROW_TYPE

CORPORA = os.environ.get("SHARDFEED_CORPORA")
UNITREE = Path(CORPORA or "", "lerobot_v21_unitree_g1")
REACHY = Path(CORPORA or "", "lerobot_v30_reachy2_apple_storage")
needs_corpora = pytest.mark.skipif(
    not CORPORA, reason="SHARDFEED_CORPORA is not set (scripts/test.sh sets it)"
)


# ---- helpers -------------------------------------------------------------------------------


def scan_all(source: LeRobotSource):
    spec = source.spec()
    units, rejects = [], []
    for rel in source.files():
        result = source.scan(rel, spec)
        units += result.units
        rejects += result.rejects
    return spec, units, rejects


def flat_values(column: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, np.ndarray | None]:
    """Leaf values and per-row list lengths (None for scalars): compares list<T> with T[n]."""
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if pa.types.is_list(array.type) or pa.types.is_fixed_size_list(array.type):
        lengths = pa.compute.list_value_length(array).to_numpy(zero_copy_only=False)
        return array.flatten().to_numpy(zero_copy_only=False), lengths
    return array.to_numpy(zero_copy_only=False), None


def assert_same_values(ours: pa.Table, theirs: pa.Table) -> None:
    assert ours.column_names == [c for c in theirs.column_names if c in ours.column_names]
    assert ours.num_rows == theirs.num_rows
    for name in ours.column_names:
        a, b = ours.schema.field(name).type, theirs.schema.field(name).type
        if pa.types.is_struct(a):
            assert a == b == IMAGE_ARROW_TYPE, name
            assert ours.column(name).to_pylist() == theirs.column(name).to_pylist(), name
            continue
        leaf_a = a.value_type if hasattr(a, "value_type") else a
        leaf_b = b.value_type if hasattr(b, "value_type") else b
        assert leaf_a == leaf_b, name  # same dtype, variable lists may become fixed-size lists
        (va, la), (vb, lb) = flat_values(ours.column(name)), flat_values(theirs.column(name))
        assert va.dtype == vb.dtype, name
        np.testing.assert_array_equal(va, vb, err_msg=name)
        if la is not None or lb is not None:
            np.testing.assert_array_equal(la, lb, err_msg=name)


def image_struct(blobs: list[bytes]) -> pa.Array:
    return pa.array([{"bytes": b, "path": None} for b in blobs], IMAGE_ARROW_TYPE)


# ---- generated v2.1 fixture ----------------------------------------------------------------

V21_FEATURES = {
    "observation.state": {"dtype": "float32", "shape": [3], "names": [["a", "b", "c"]]},
    "observation.images.top": {"dtype": "image", "shape": [4, 4, 3], "names": ["h", "w", "c"]},
    "timestamp": {"dtype": "float32", "shape": [1], "names": None},
    "frame_index": {"dtype": "int64", "shape": [1], "names": None},
    "episode_index": {"dtype": "int64", "shape": [1], "names": None},
    "index": {"dtype": "int64", "shape": [1], "names": None},
    "task_index": {"dtype": "int64", "shape": [1], "names": None},
}
V21_DATA = "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet"
V21_VIDEO = "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4"


def episode_table(episode: int, length: int, first_index: int, task: int = 0) -> pa.Table:
    rng = np.random.default_rng(episode)
    state = rng.normal(size=(length, 3)).astype(np.float32)
    return pa.table(
        {
            "observation.state": pa.FixedSizeListArray.from_arrays(pa.array(state.reshape(-1)), 3),
            "observation.images.top": image_struct(
                [bytes([episode, i]) * (i + 1) for i in range(length)]
            ),
            "timestamp": pa.array(np.arange(length, dtype=np.float32) / 10),
            "frame_index": pa.array(np.arange(length, dtype=np.int64)),
            "episode_index": pa.array(np.full(length, episode, dtype=np.int64)),
            "index": pa.array(np.arange(first_index, first_index + length, dtype=np.int64)),
            "task_index": pa.array(np.full(length, task, dtype=np.int64)),
        }
    )


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def make_v21(
    root: Path,
    lengths: dict[int, int],
    *,
    meta_lengths: dict[int, int] | None = None,
    features: dict | None = None,
    total_frames: int | None = None,
) -> dict[int, pa.Table]:
    """Write a v2.1 dataset: one Parquet file per episode in ``lengths`` (episode -> rows);
    episodes.jsonl lists ``meta_lengths`` (default: the same)."""
    meta_lengths = dict(lengths) if meta_lengths is None else meta_lengths
    features = features or V21_FEATURES
    tables, first = {}, 0
    for ep, n in sorted(lengths.items()):
        table = episode_table(ep, n, first, task=ep % 2)
        tables[ep] = table
        first += n
        path = root / V21_DATA.format(episode_chunk=0, episode_index=ep)
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, path)
    info = {
        "codebase_version": "v2.1",
        "robot_type": "toy",
        "total_episodes": len(meta_lengths),
        "total_frames": sum(lengths.values()) if total_frames is None else total_frames,
        "total_tasks": 2,
        "total_videos": 0,
        "total_chunks": 1,
        "chunks_size": 1000,
        "fps": 10,
        "splits": {"train": f"0:{len(meta_lengths)}"},
        "data_path": V21_DATA,
        "video_path": V21_VIDEO,
        "features": features,
    }
    (root / "meta").mkdir(parents=True, exist_ok=True)
    (root / "meta/info.json").write_text(json.dumps(info, indent=4))
    write_jsonl(
        root / "meta/episodes.jsonl",
        [
            {"episode_index": ep, "tasks": [f"task {ep % 2}"], "length": n}
            for ep, n in sorted(meta_lengths.items())
        ],
    )
    write_jsonl(
        root / "meta/tasks.jsonl",
        [{"task_index": 1, "task": "task 1"}, {"task_index": 0, "task": "task 0"}],
    )
    write_jsonl(
        root / "meta/episodes_stats.jsonl",
        [
            {"episode_index": ep, "stats": {"timestamp": {"min": [0.0], "max": [1.0]}}}
            for ep in sorted(meta_lengths)
        ],
    )
    return tables


def test_v21_fixture_units_rows_and_values(tmp_path):
    tables = make_v21(tmp_path, {0: 3, 1: 5, 2: 4})
    source = LeRobotSource(tmp_path)
    assert source.version == "v2.1" and source.kind == "lerobot"
    assert source.files() == [V21_DATA.format(episode_chunk=0, episode_index=i) for i in range(3)]
    spec, units, rejects = scan_all(source)
    assert rejects == []
    assert [(u.position, u.rows, u.locator) for u in units] == [
        (0, 3, (0, 3)),
        (1, 5, (0, 5)),
        (2, 4, (0, 4)),
    ]
    # payload: 3 floats + image bytes (i+1)*2 + 5 x 4/8-byte scalars
    assert units[0].payload_bytes == sum(12 + 2 * (i + 1) + 4 + 8 * 4 for i in range(3))
    assert all(len(u.content_hash) == 32 for u in units)
    assert len({u.content_hash for u in units}) == 3
    # spec keeps info.json's features, adds fps like LeRobot's v2.1 -> v3.0 converter
    assert spec.names == list(V21_FEATURES)
    assert spec["observation.state"].extra["fps"] == 10
    assert spec["observation.state"].names == [["a", "b", "c"]]
    assert spec["observation.images.top"].dtype == "image"
    meta = source.meta()
    assert meta.fps == 10 and meta.robot_type == "toy"
    assert meta.tasks == ("task 0", "task 1")  # ordered by task_index, not by line
    assert meta.notes == ()
    out = source.read(units, spec)
    assert out.schema == spec.arrow_schema()
    assert_same_values(out, pa.concat_tables(tables[i] for i in range(3)))
    assert source.episodes_stats()[2]["timestamp"]["max"] == [1.0]


def test_v21_fixture_inconsistent_episodes_are_rejects(tmp_path):
    # episode 1 is 5 rows but metadata says 6; episode 3 has rows but no metadata;
    # episode 4 is in metadata but has no file
    make_v21(tmp_path, {0: 3, 1: 5, 2: 4, 3: 2}, meta_lengths={0: 3, 1: 6, 2: 4, 4: 7})
    source = LeRobotSource(tmp_path)
    assert V21_DATA.format(episode_chunk=0, episode_index=4) in source.files()
    _spec, units, rejects = scan_all(source)
    assert [u.position for u in units] == [0, 2]
    got = {(r.position, r.reason) for r in rejects}
    assert got == {
        ("episode:1", "episode_inconsistent"),
        ("episode:3", "episode_inconsistent"),
        ("episode:4", "episode_inconsistent"),
    }
    by_pos = {r.position: r for r in rejects}
    assert "length 6" in by_pos["episode:1"].message and "5 rows" in by_pos["episode:1"].message
    assert "no entry" in by_pos["episode:3"].message
    assert "does not exist" in by_pos["episode:4"].message
    assert by_pos["episode:4"].source == "data/chunk-000/episode_000004.parquet"
    notes = source.meta().notes
    assert "info.json total_episodes=4 but meta/episodes.jsonl has 4 episodes" not in notes
    assert any("episode lengths in meta/episodes.jsonl sum to 20" in n for n in notes), notes


def test_v21_episode_in_the_wrong_file_and_non_contiguous_rows(tmp_path):
    make_v21(tmp_path, {0: 3, 1: 4})
    # rewrite episode 1's file: rows of episode 0 and 1 interleaved (0, 1, 0)
    path = tmp_path / V21_DATA.format(episode_chunk=0, episode_index=1)
    a, b = episode_table(0, 3, 0), episode_table(1, 4, 3)
    pq.write_table(pa.concat_tables([a.slice(0, 1), b, a.slice(1, 2)]), path)
    source = LeRobotSource(tmp_path)
    spec = source.spec()
    result = source.scan(path.relative_to(tmp_path).as_posix(), spec)
    assert [u.position for u in result.units] == [1]
    assert result.units[0].locator == (1, 5)
    [reject] = result.rejects
    assert reject.position == "episode:0" and "not contiguous" in reject.message
    # read honours the locator inside a mixed file
    assert source.read(result.units, spec).column("episode_index").to_pylist() == [1] * 4


def test_v21_wrong_index_and_task_index_are_rejects(tmp_path):
    make_v21(tmp_path, {0: 3, 1: 4})
    path = tmp_path / V21_DATA.format(episode_chunk=0, episode_index=0)
    table = episode_table(0, 3, 0)
    table = table.set_column(5, "index", pa.array([0, 1, 5], pa.int64()))
    pq.write_table(table, path)
    path1 = tmp_path / V21_DATA.format(episode_chunk=0, episode_index=1)
    table1 = episode_table(1, 4, 3)
    pq.write_table(table1.set_column(6, "task_index", pa.array([0, 0, 2, 0], pa.int64())), path1)
    source = LeRobotSource(tmp_path)
    _spec, units, rejects = scan_all(source)
    assert units == []
    assert {r.position: r.reason for r in rejects} == {
        "episode:0": "episode_inconsistent",
        "episode:1": "episode_inconsistent",
    }
    assert "not consecutive" in rejects[0].message
    assert "task_index" in rejects[1].message


def test_v21_unreadable_and_escaping_data_files(tmp_path):
    make_v21(tmp_path / "ds", {0: 3, 1: 4})
    root = tmp_path / "ds"
    (root / V21_DATA.format(episode_chunk=0, episode_index=1)).write_bytes(b"not parquet")
    outside = tmp_path / "outside.parquet"
    pq.write_table(episode_table(9, 2, 0), outside)
    os.symlink(outside, root / "data/chunk-000/episode_000009.parquet")
    source = LeRobotSource(root)
    _spec, units, rejects = scan_all(source)
    assert [u.position for u in units] == [0]
    assert {(r.source, r.position, r.reason) for r in rejects} == {
        ("data/chunk-000/episode_000001.parquet", "", "io_error"),
        ("data/chunk-000/episode_000009.parquet", "", "path_escape"),
    }


def test_v21_videos(tmp_path):
    features = {
        **V21_FEATURES,
        "observation.images.cam": {"dtype": "video", "shape": [4, 4, 3], "names": None},
    }
    make_v21(tmp_path, {0: 3, 1: 4, 2: 2}, features=features)
    # no MP4 at all: the feature is dropped with a note
    source = LeRobotSource(tmp_path)
    assert "observation.images.cam" not in source.spec()
    assert source.dropped_videos == ["observation.images.cam"]
    assert any(
        "'observation.images.cam' dropped: none of its 3 MP4 files exists" in n
        for n in source.meta().notes
    )
    # some MP4s: a clear error naming a missing file, unless --drop-videos
    video = tmp_path / V21_VIDEO.format(
        episode_chunk=0, video_key="observation.images.cam", episode_index=1
    )
    video.parent.mkdir(parents=True)
    video.write_bytes(b"\x00\x00\x00\x18ftypmp42")
    with pytest.raises(ShardfeedError, match=r"missing 2 of its 3 MP4 files.*episode_000000\.mp4"):
        LeRobotSource(tmp_path)
    with pytest.raises(ShardfeedError, match="--drop-videos"):
        LeRobotSource(tmp_path)
    dropped = LeRobotSource(tmp_path, drop_videos=True)
    assert "observation.images.cam" not in dropped.spec()
    assert "video feature 'observation.images.cam' dropped (--drop-videos)" in dropped.meta().notes
    # all MP4s: the feature is kept and re-muxed (tests/test_lerobot_videos.py); these are not
    # videos, which the source finds out when it probes one for the feature's info
    for ep in (0, 2):
        video.with_name(f"episode_{ep:06d}.mp4").write_bytes(b"x")
    with pytest.raises(ShardfeedError, match=r"episode_000000\.mp4: not a readable video file"):
        LeRobotSource(tmp_path)
    assert LeRobotSource(tmp_path, drop_videos=True).spec().names == list(V21_FEATURES)


def test_v21_metadata_parsing_is_strict():
    with pytest.raises(SchemaError, match="line 2"):
        parse_episodes_jsonl('{"episode_index": 0, "length": 3}\n{"episode_index": 0, "length": 3}')
    with pytest.raises(SchemaError, match="length"):
        parse_episodes_jsonl('{"episode_index": 0, "length": -1}')
    with pytest.raises(SchemaError, match="not valid JSON"):
        parse_episodes_jsonl("{nope")
    with pytest.raises(SchemaError, match="task indices"):
        parse_tasks_jsonl('{"task_index": 1, "task": "x"}')
    assert parse_tasks_jsonl(
        '{"task_index": 1, "task": "b"}\n\n{"task_index": 0, "task": "a"}'
    ) == [
        "a",
        "b",
    ]


def test_unsupported_versions_and_detection(tmp_path):
    (tmp_path / "meta").mkdir()
    assert lerobot_codebase_version(tmp_path) is None
    (tmp_path / "meta/info.json").write_text('{"codebase_version": "v1.6"}')
    assert lerobot_codebase_version(tmp_path) == "v1.6"
    with pytest.raises(ShardfeedError, match=r"unsupported LeRobot codebase_version 'v1\.6'"):
        LeRobotSource(tmp_path)
    with pytest.raises(ShardfeedError, match="not a LeRobot dataset"):
        LeRobotSource(tmp_path / "nothing")


# ---- generated v3.0 fixture ----------------------------------------------------------------

V30_DATA = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"


def v30_rows(episode: int, length: int, first: int, width: int = 2) -> pa.Table:
    """Frames with a variable-length list<float> state of constant ``width`` (like reachy2)."""
    values = [[float(episode * 100 + i + k / 10) for k in range(width)] for i in range(length)]
    return pa.table(
        {
            "observation.state": pa.array(values, pa.list_(pa.float32())),
            "timestamp": pa.array(np.arange(length, dtype=np.float32) / 30),
            "frame_index": pa.array(np.arange(length, dtype=np.int64)),
            "episode_index": pa.array(np.full(length, episode, dtype=np.int64)),
            "index": pa.array(np.arange(first, first + length, dtype=np.int64)),
            "task_index": pa.array(np.zeros(length, dtype=np.int64)),
        }
    )


def make_v30(root: Path, files: list[list[pa.Table]], episodes: list[dict], **info_kw) -> None:
    features = {
        "observation.state": {"dtype": "float32", "shape": [2], "names": None, "fps": 30},
        "observation.image": {"dtype": "video", "shape": [3, 4, 4], "names": None},
        **{
            name: {
                "dtype": "float32" if name == "timestamp" else "int64",
                "shape": [1],
                "names": None,
                "fps": 30,
            }
            for name in ("timestamp", "frame_index", "episode_index", "index", "task_index")
        },
    }
    for number, parts in enumerate(files):
        path = root / V30_DATA.format(chunk_index=0, file_index=number)
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.concat_tables(parts), path, row_group_size=4)
    info = {
        "codebase_version": "v3.0",
        "robot_type": "toy3",
        "total_episodes": len(episodes),
        "total_frames": sum(p.num_rows for parts in files for p in parts),
        "total_tasks": 1,
        "chunks_size": 1000,
        "fps": 30,
        "splits": {"train": f"0:{len(episodes)}"},
        "data_path": V30_DATA,
        "video_path": "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4",
        "features": features,
        "data_files_size_in_mb": 100,
        "video_files_size_in_mb": 500,
        **info_kw,
    }
    (root / "meta/episodes/chunk-000").mkdir(parents=True, exist_ok=True)
    (root / "meta/info.json").write_text(json.dumps(info, indent=2))
    pq.write_table(
        pa.table({"task_index": [0], "__index_level_0__": ["stack"]}), root / "meta/tasks.parquet"
    )
    rows = [
        {
            "episode_index": e["episode_index"],
            "data/chunk_index": 0,
            "data/file_index": e["file"],
            "dataset_from_index": e["from"],
            "dataset_to_index": e["to"],
            "videos/observation.image/chunk_index": 0,
            "videos/observation.image/file_index": 0,
            "tasks": ["stack"],
            "length": e.get("length", e["to"] - e["from"]),
        }
        for e in episodes
    ]
    pq.write_table(pa.Table.from_pylist(rows), root / "meta/episodes/chunk-000/file-000.parquet")


def test_v30_fixture_rejects_and_reads_across_row_groups(tmp_path):
    e0, e1, e2 = v30_rows(0, 5, 0), v30_rows(1, 7, 5), v30_rows(2, 3, 12)
    bad_width = v30_rows(3, 4, 15, width=2)
    bad_width = bad_width.set_column(
        0, "observation.state", pa.array([[1.0, 2.0]] * 3 + [[1.0]], pa.list_(pa.float32()))
    )
    e4 = v30_rows(4, 6, 19)
    e5 = v30_rows(5, 2, 25)
    make_v30(
        tmp_path,
        [[e0, e1], [e2, bad_width, e4, e5]],
        [
            {"episode_index": 0, "file": 0, "from": 0, "to": 5},
            {"episode_index": 1, "file": 0, "from": 5, "to": 12},
            {"episode_index": 2, "file": 1, "from": 12, "to": 15},
            {"episode_index": 3, "file": 1, "from": 15, "to": 19},
            {"episode_index": 4, "file": 1, "from": 20, "to": 26},  # off by one vs index column
            {"episode_index": 5, "file": 1, "from": 25, "to": 28, "length": 2},  # span 3 != 2 rows
        ],
        total_frames=999,
    )
    source = LeRobotSource(tmp_path)
    assert source.version == "v3.0"
    assert source.files() == ["data/chunk-000/file-000.parquet", "data/chunk-000/file-001.parquet"]
    spec, units, rejects = scan_all(source)
    assert spec["observation.state"].arrow_type == pa.list_(pa.float32(), 2)
    assert "observation.image" not in spec  # no MP4: dropped with a note
    assert [(u.position, u.locator) for u in units] == [(0, (0, 5)), (1, (5, 12)), (2, (0, 3))]
    got = {r.position: r for r in rejects}
    assert got["episode:3"].reason == "field_type"
    assert "observation.state" in got["episode:3"].message
    assert got["episode:4"].reason == "episode_inconsistent"
    assert "index column" in got["episode:4"].message
    assert got["episode:5"].reason == "episode_inconsistent"
    assert "25..28 (3 rows)" in got["episode:5"].message
    notes = source.meta().notes
    assert "info.json total_frames=999 but the data has 27 rows" in notes
    assert source.meta().tasks == ("stack",)
    # shuffled order; episode 1 spans row groups 1..2 of file 0
    order = [units[2], units[0], units[1]]
    out = source.read(order, spec)
    expected = pa.concat_tables([e2, e0, e1])
    assert_same_values(out, expected)
    assert out.column("observation.state").type == pa.list_(pa.float32(), 2)


def test_v30_non_contiguous_and_missing_file(tmp_path):
    e0, e1 = v30_rows(0, 4, 0), v30_rows(1, 3, 4)
    make_v30(
        tmp_path,
        [[e0.slice(0, 2), e1, e0.slice(2, 2)]],
        [
            {"episode_index": 0, "file": 0, "from": 0, "to": 4},
            {"episode_index": 1, "file": 0, "from": 4, "to": 7},
            {"episode_index": 2, "file": 3, "from": 7, "to": 9},
        ],
    )
    source = LeRobotSource(tmp_path)
    assert "data/chunk-000/file-003.parquet" in source.files()
    _spec, units, rejects = scan_all(source)
    # episode 1 sits between the two runs of episode 0; its own rows and index column are fine
    assert [(u.position, u.locator) for u in units] == [(1, (2, 5))]
    reasons = {r.position: r.message for r in rejects}
    assert "not contiguous" in reasons["episode:0"]
    assert "does not exist" in reasons["episode:2"]


def test_content_hash_is_canonical_and_sources_pickle(tmp_path):
    make_v21(tmp_path, {0: 6, 1: 2})
    source = LeRobotSource(tmp_path)
    spec, units, _ = scan_all(source)
    clone = pickle.loads(pickle.dumps(source))
    _, again, _ = scan_all(clone)
    assert [u.content_hash for u in again] == [u.content_hash for u in units]
    table = source.read(units[:1], spec)
    chunked = pa.concat_tables([table.slice(0, 2), table.slice(2, 1), table.slice(3)])
    assert table_hash(chunked) == table_hash(table) == units[0].content_hash
    bigger = source.read(units, spec)
    assert table_hash(bigger.slice(0, 6)) == units[0].content_hash
    assert table_hash(bigger.slice(6)) == units[1].content_hash
    # read refuses a ref that no longer matches the file
    stale = UnitRef(units[1].file, 7, 2, 0, "x", (0, 2))
    with pytest.raises(ShardfeedError, match="no longer hold episode 7"):
        source.read([stale], spec)
    assert source.read([], spec).schema == spec.arrow_schema()


# ---- real corpora --------------------------------------------------------------------------


@needs_corpora
def test_unitree_v21_without_drop_videos_names_a_missing_mp4():
    assert lerobot_codebase_version(UNITREE) == "v2.1"
    with pytest.raises(ShardfeedError) as info:
        LeRobotSource(UNITREE)
    message = str(info.value)
    assert "observation.images.cam_high" in message and "missing 97 of its 100" in message
    assert "videos/chunk-000/observation.images.cam_high/episode_000000.mp4" in message
    assert "--drop-videos" in message


@needs_corpora
def test_unitree_v21_every_frame_matches_the_source():
    source = LeRobotSource(UNITREE, drop_videos=True)
    spec, units, rejects = scan_all(source)
    assert rejects == []
    assert len(source.files()) == 100 and len(units) == 100
    assert sum(u.rows for u in units) == 35_965
    assert "observation.images.cam_high" not in spec
    assert spec.names == [
        "observation.state",
        "action",
        "timestamp",
        "frame_index",
        "episode_index",
        "index",
        "task_index",
    ]
    episodes = [
        json.loads(line) for line in (UNITREE / "meta/episodes.jsonl").read_text().splitlines()
    ]
    assert [(u.position, u.rows) for u in units] == [
        (e["episode_index"], e["length"]) for e in episodes
    ]
    assert all(u.locator == (0, u.rows) for u in units)
    assert all(u.file == f"data/chunk-000/episode_{u.position:06d}.parquet" for u in units)
    # 26+26 float32 + float32 + 4 int64 per frame
    assert all(u.payload_bytes == u.rows * (52 * 4 + 4 + 32) for u in units)
    assert len({u.content_hash for u in units}) == 100
    meta = source.meta()
    assert meta.fps == 30 and meta.robot_type == "Unitree_G1_Inspire"
    assert meta.tasks == ("Pick up the yellow bottle on the table.",)
    assert meta.notes == ("video feature 'observation.images.cam_high' dropped (--drop-videos)",)
    ours = source.read(units, spec)
    assert ours.num_rows == 35_965
    theirs = pa.concat_tables(
        pq.read_table(UNITREE / u.file).replace_schema_metadata(None) for u in units
    )
    assert_same_values(ours, theirs)
    assert len(source.episodes_stats()) == 100


@needs_corpora
def test_unitree_read_in_reversed_order():
    source = LeRobotSource(UNITREE, drop_videos=True)
    spec = source.spec()
    files = source.files()
    units = [u for rel in files[:5] for u in source.scan(rel, spec).units]
    out = source.read(list(reversed(units)), spec)
    episode = out.column("episode_index").to_numpy()
    expected = np.concatenate([np.full(u.rows, u.position) for u in reversed(units)])
    np.testing.assert_array_equal(episode, expected)
    theirs = pa.concat_tables(
        pq.read_table(UNITREE / u.file).replace_schema_metadata(None) for u in reversed(units)
    )
    assert_same_values(out, theirs)


@needs_corpora
def test_reachy2_v30_every_frame_matches_and_the_totals_warning_is_a_note():
    assert lerobot_codebase_version(REACHY) == "v3.0"
    source = LeRobotSource(REACHY)  # no MP4 at all: its video feature is dropped with a note
    spec, units, rejects = scan_all(source)
    assert rejects == []
    assert [(u.position, u.rows, u.locator) for u in units] == [
        (0, 299, (0, 299)),
        (1, 300, (299, 599)),
        (2, 300, (599, 899)),
    ]
    assert sum(u.rows for u in units) == 899
    # variable-length list<float> of constant length 19 becomes the spec's fixed_size_list
    assert spec["observation.state"].arrow_type == pa.list_(pa.float32(), 19)
    assert "observation.image" not in spec
    meta = source.meta()
    assert meta.fps == 30 and meta.robot_type == "reachy2"
    assert meta.tasks == ("place the apple in the plate",)
    assert "info.json total_frames=14983 but the data has 899 rows" in meta.notes
    assert source.reject_location(units[1]) == ("data/chunk-000/file-000.parquet", "episode:1")
    assert any("'observation.image' dropped" in n for n in meta.notes)
    assert not any("episode lengths" in n for n in meta.notes)  # episode metadata agrees
    theirs = pq.read_table(REACHY / "data/chunk-000/file-000.parquet").replace_schema_metadata(None)
    assert_same_values(source.read(units, spec), theirs)
    # reversed episode order
    out = source.read(units[::-1], spec)
    assert_same_values(
        out,
        pa.concat_tables([theirs.slice(599, 300), theirs.slice(299, 300), theirs.slice(0, 299)]),
    )
    dropped = LeRobotSource(REACHY, drop_videos=True)
    assert "video feature 'observation.image' dropped (--drop-videos)" in dropped.meta().notes
    assert dropped.spec() == spec


@pytest.mark.parametrize("version", ["v2.1", "v3.0"])
@pytest.mark.parametrize(
    "template, says",
    [
        ("data/{chunk_index:>999999999}/{file_index}{episode_index}.parquet", "integer width"),
        ("data/{chunk_index.__class__}/{file_index}{episode_index}.parquet", "is not one of"),
        ("data/{x[0]}/{chunk_index}{file_index}{episode_index}.parquet", "is not one of"),
    ],
)
def test_a_hostile_path_template_is_refused_before_it_is_expanded(
    tmp_path, version, template, says
):
    """info.json's data_path is input: a width of a billion, attribute or index lookups are a
    SchemaError naming data_path and the placeholder, before any path is built (no string of a
    gigabyte first: peak traced memory stays under 64 MiB)."""
    import tracemalloc

    if version == "v2.1":
        make_v21(tmp_path, {0: 3})
    else:
        make_v30(
            tmp_path, [[v30_rows(0, 3, 0)]], [{"episode_index": 0, "file": 0, "from": 0, "to": 3}]
        )
    info = json.loads((tmp_path / "meta/info.json").read_text())
    info["data_path"] = template
    (tmp_path / "meta/info.json").write_text(json.dumps(info))
    tracemalloc.start()
    try:
        with pytest.raises(SchemaError) as refused:
            LeRobotSource(tmp_path).units()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert refused.value.field == "data_path", refused.value
    assert says in str(refused.value) and peak < 64 << 20, (str(refused.value)[:200], peak)
