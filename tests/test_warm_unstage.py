"""``shardfeed warm`` fills one node's tier; ``shardfeed unstage`` removes only what was staged."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from staging_fixtures import dataset, final_files

from shardfeed.assignment import World, assign
from shardfeed.cli.main import main
from shardfeed.schemas.locations import Locations
from shardfeed.staging import StageError, stage
from shardfeed.unstaging import unstage
from shardfeed.warming import WARM_RECORD, warm


def tiers(base: Path, nvme_capacity: str = "1GB") -> Path:
    path = base / "tiers.toml"
    path.write_text(
        f"""
[tiers.nvme]
path = "{base}/nvme/{{dataset}}"
scope = "node"
capacity = "{nvme_capacity}"
read_bandwidth = "5GB/s"

[tiers.pfs]
path = "{base}/pfs/{{dataset}}"
scope = "shared"
capacity = "1GB"
read_bandwidth = "2GB/s"

[policy]
hot = ["nvme", "pfs"]
all = ["pfs"]
"""
    )
    return path


def shards(root: Path) -> list[dict]:
    return json.loads((root / "meta/shardfeed/manifest.json").read_text())["shards"]


def test_warm_copies_hot_then_assigned_shards_within_capacity(tmp_path):
    src = dataset(tmp_path / "ds", n=400, size=2000, hot_shards=1)
    config = tiers(tmp_path)
    stage(src, config)
    plan = assign(src, World(2, 2, 1), name="a")
    report = warm(src, config, node_rank=1, nodes=2, assignment="a")
    records = shards(src)
    epoch = plan.epoch_plan(0)
    mine = set(epoch.spans.shard[epoch.rank // 2 == 1].tolist())
    expected = [records[0]["path"], *(records[s]["path"] for s in sorted(mine) if s != 0)]
    assert sorted(report.planned) == sorted(expected) and report.planned[0] == records[0]["path"]
    assert report.source == str(tmp_path / "pfs/ds")  # the nearest complete shared copy
    node = tmp_path / "nvme/ds"
    files = final_files(node)
    assert sorted(f for f in files if f != WARM_RECORD) == sorted(expected)
    sha = {r["path"]: r["sha256"] for r in records}
    assert all(hashlib.sha256(files[p]).hexdigest() == sha[p] for p in expected)
    assert json.loads(files[WARM_RECORD])["created"] == sorted(expected)
    again = warm(src, config, node_rank=1, nodes=2, assignment="a")
    assert again.copied == 0 and again.skipped == len(expected)

    small = tiers(tmp_path, nvme_capacity=str(records[0]["bytes"] + 1))
    capped = warm(src, small, node_rank=0, nodes=2, assignment="a", dry_run=True)
    assert capped.planned == [records[0]["path"]] and capped.left_out > 0


def test_warm_never_replaces_a_file_it_did_not_create(tmp_path):
    src = dataset(tmp_path / "ds", n=200, hot_shards=2)
    config = tiers(tmp_path)
    foreign = tmp_path / "nvme/ds" / shards(src)[1]["path"]
    foreign.parent.mkdir(parents=True)
    foreign.write_bytes(b"someone else's file")
    with pytest.raises(StageError, match="was not written by shardfeed warm"):
        warm(src, config, node_rank=0, nodes=1)
    assert foreign.read_bytes() == b"someone else's file"
    with pytest.raises(ValueError, match=r"outside 0\.\.1"):
        warm(src, config, node_rank=2, nodes=2)
    assign(src, World(3, 1, 1), name="three")
    with pytest.raises(ValueError, match="is for 3 nodes, not 2"):
        warm(src, config, node_rank=0, nodes=2, assignment="three")


def test_unstage_removes_only_unchanged_staged_files(tmp_path, capsys):
    src = dataset(tmp_path / "ds", n=200, hot_shards=1)
    config = tiers(tmp_path)
    stage(src, config)
    warm(src, config, node_rank=0, nodes=1)
    pfs = tmp_path / "pfs/ds"
    (pfs / "notes.txt").write_text("not staged")
    changed = pfs / "meta/info.json"
    changed.write_bytes(changed.read_bytes() + b" ")
    assert main(["unstage", str(src), "--tiers", str(config), "--tier", "pfs"]) == 1
    out = capsys.readouterr().out
    assert "kept meta/info.json" in out
    assert sorted(final_files(pfs)) == ["meta/info.json", "notes.txt"]
    locations = Locations.loads((src / "meta/shardfeed/locations.json").read_bytes())
    assert locations.files == {"meta/info.json": ("pfs",)} and "pfs" in locations.tiers
    assert [r.removed for r in unstage(src, config, only=("nvme",))] == [1]
    assert not (tmp_path / "nvme/ds").exists()  # only empty directories were left: removed
    with pytest.raises(StageError, match=r"\['nvme'\] hold nothing staged"):
        unstage(src, config, only=("nvme",))
    with pytest.raises(StageError, match="not in the tier config"):
        unstage(src, config, only=("cold",))
    np.testing.assert_equal((pfs / "notes.txt").read_text(), "not staged")
