"""Conformance with real LeRobot v3.0 data: read theirs with our formats code, rewrite it, compare.

Runs over ``$SHARDFEED_CORPORA/lerobot_v30_reachy2_apple_storage`` (scripts/test.sh sets the variable
when ../shared/corpora exists). The dataset has no MP4s, so its one video feature is dropped on rewrite
and the video columns of its episode metadata are out of scope here.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from shardfeed import open_dataset, write_dataset
from shardfeed.formats.sources.lerobot import LeRobotSource
from shardfeed.formats.verify import verify_dataset
from shardfeed.schemas.features import FeatureSpec

CORPORA = os.environ.get("SHARDFEED_CORPORA")
REACHY = Path(CORPORA or "", "lerobot_v30_reachy2_apple_storage")
pytestmark = pytest.mark.skipif(
    not CORPORA, reason="SHARDFEED_CORPORA is not set (scripts/test.sh sets it)"
)

META_FILES = [
    "meta/info.json",
    "meta/stats.json",
    "meta/tasks.parquet",
    "meta/episodes/chunk-000/file-000.parquet",
]


def _read_all(source: LeRobotSource, spec: FeatureSpec):
    """Every episode, in source file order, read with our formats code."""
    refs = sorted(ref for f in source.files() for ref in source.scan(f, spec).units)
    return source.read(refs, spec)


@pytest.fixture(scope="module")
def rewritten(tmp_path_factory):
    source = LeRobotSource(REACHY)
    spec = source.spec()
    out = tmp_path_factory.mktemp("reachy") / "ds"
    data = _read_all(source, spec)
    write_dataset(
        out,
        spec,
        data,
        tasks=source.tasks,
        fps=source.fps,
        robot_type=source.robot_type,
        source="lerobot_v30_reachy2_apple_storage",
    )
    return source, data, out


def test_reads_their_metadata_and_flags_the_upstream_inconsistency():
    source = LeRobotSource(REACHY)
    assert source.version == "v3.0"
    assert source.tasks == ["place the apple in the plate"]
    assert source.files() == ["data/chunk-000/file-000.parquet"]
    assert _read_all(source, source.spec()).num_rows == 899
    # the published subset keeps the full dataset's total_frames: a real metadata/data disagreement
    assert source.inconsistencies() == ["info.json total_frames=14983 but the data has 899 rows"]


def test_same_files_and_info_keys(rewritten):
    _source, _, out = rewritten
    for rel in [*META_FILES, "data/chunk-000/file-000.parquet"]:
        assert (REACHY / rel).is_file() and (out / rel).is_file(), rel
    theirs = json.loads((REACHY / "meta/info.json").read_text())
    ours = json.loads((out / "meta/info.json").read_text())
    assert list(ours) == list(theirs)
    for name, feature in ours["features"].items():
        assert feature == theirs["features"][name]
    assert ours["total_frames"] == 899 and ours["total_episodes"] == 3 and ours["total_tasks"] == 1
    assert ours["fps"] == theirs["fps"] and ours["robot_type"] == theirs["robot_type"]
    assert ours["data_path"] == theirs["data_path"]


def test_same_data_columns_and_values(rewritten):
    _, data, out = rewritten
    theirs = pq.read_schema(REACHY / "data/chunk-000/file-000.parquet")
    ours = pq.read_schema(out / "data/chunk-000/file-000.parquet")
    assert ours.names == theirs.names
    for name in ours.names:
        a, b = ours.field(name).type, theirs.field(name).type
        # tensors are fixed-size lists (zero-copy); theirs are variable lists of the same element type
        assert (a.value_type if hasattr(a, "value_type") else a) == (
            b.value_type if hasattr(b, "value_type") else b
        ), name
    ds = open_dataset(out)
    batch = ds.read(0, len(ds))
    assert (
        batch["observation.state"].shape == (899, 19)
        and batch["observation.state"].dtype == np.float32
    )
    np.testing.assert_array_equal(
        batch["observation.state"],
        np.array(data.column("observation.state").to_pylist(), dtype=np.float32),
    )
    np.testing.assert_array_equal(batch["index"], np.arange(899))
    assert verify_dataset(out).ok


def test_tasks_parquet_matches(rewritten):
    _, _, out = rewritten
    theirs, ours = (
        pq.read_table(REACHY / "meta/tasks.parquet"),
        pq.read_table(out / "meta/tasks.parquet"),
    )
    assert ours.schema.remove_metadata() == theirs.schema.remove_metadata()
    assert ours.to_pylist() == theirs.to_pylist()
    pandas_meta = json.loads(ours.schema.metadata[b"pandas"])
    assert (
        pandas_meta["index_columns"]
        == json.loads(theirs.schema.metadata[b"pandas"])["index_columns"]
    )


def test_episode_metadata_matches(rewritten):
    _, _, out = rewritten
    theirs = pq.read_table(REACHY / "meta/episodes/chunk-000/file-000.parquet")
    ours = pq.read_table(out / "meta/episodes/chunk-000/file-000.parquet")
    video = [
        c
        for c in theirs.column_names
        if c.startswith("videos/") or c.startswith("stats/observation.image/")
    ]
    quantiles = [
        c for c in ours.column_names if c.rsplit("/", 1)[-1] in ("q01", "q10", "q50", "q90", "q99")
    ]
    assert [c for c in ours.column_names if c not in quantiles] == [
        c for c in theirs.column_names if c not in video
    ]
    for name in ours.column_names:
        if name in quantiles:
            continue
        assert ours.schema.field(name).type == theirs.schema.field(name).type, name
        a, b = ours.column(name).to_pylist(), theirs.column(name).to_pylist()
        if name.startswith("stats/"):
            np.testing.assert_allclose(
                np.array(a, dtype=float),
                np.array(b, dtype=float),
                rtol=1e-4,
                atol=1e-5,
                err_msg=name,
            )
        else:
            assert a == b, name


def test_stats_json_matches(rewritten):
    _, _, out = rewritten
    theirs = json.loads((REACHY / "meta/stats.json").read_text())
    ours = json.loads((out / "meta/stats.json").read_text())
    assert set(ours) == set(theirs) - {"observation.image"}
    for name, stats in ours.items():
        assert set(stats) == {
            "min",
            "max",
            "mean",
            "std",
            "count",
            "q01",
            "q10",
            "q50",
            "q90",
            "q99",
        }
        for key in ("min", "max", "mean", "std", "count"):
            a, b = np.array(stats[key]), np.array(theirs[name][key])
            assert a.shape == b.shape, (name, key)
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5, err_msg=f"{name}.{key}")
        assert np.all(np.array(stats["q01"]) <= np.array(stats["q50"])) and np.all(
            np.array(stats["q50"]) <= np.array(stats["q99"])
        )


def test_pandas_reads_tasks_the_lerobot_way(rewritten):
    pd = pytest.importorskip("pandas")
    _, _, out = rewritten
    ours, theirs = (
        pd.read_parquet(out / "meta/tasks.parquet"),
        pd.read_parquet(REACHY / "meta/tasks.parquet"),
    )
    assert list(ours.index) == list(theirs.index) == ["place the apple in the plate"]
    assert list(ours["task_index"]) == [0]
