"""Reads through staged tier copies (locations.json), their fallbacks, and ``inspect``'s tiers."""

from __future__ import annotations

import json
import logging
import shutil

import numpy as np
import pytest
from staging_fixtures import dataset, tiers_toml

from shardfeed.cli.main import main
from shardfeed.formats.reader import open_dataset
from shardfeed.schemas.locations import Locations
from shardfeed.staging import stage

moto_server = pytest.importorskip("moto.server")

LOCATIONS = "meta/shardfeed/locations.json"
HOT = 2  # the leading shards marked hot: staged to warm as well as pfs


@pytest.fixture
def staged(tmp_path):
    """(source, its full contents read without tiers, shard paths) after staging to pfs and warm."""
    src = dataset(tmp_path / "ds", hot_shards=HOT)
    stage(src, tiers_toml(tmp_path, cold=False))
    with open_dataset(src, use_locations=False) as ds:
        expected = ds.read(0, len(ds))
        paths = [s.path for s in ds.shards]
    assert len(paths) >= 4
    return src, expected, paths


def sources(ds) -> list[str]:
    return [ds.shard_source(i) for i in range(len(ds.shards))]


def assert_same(got: dict, expected: dict) -> None:
    assert got.keys() == expected.keys()
    for name in expected:
        np.testing.assert_array_equal(got[name], expected[name])


def warnings_of(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_reads_prefer_node_copy_then_fastest_shared_tier(staged, tmp_path, caplog):
    src, expected, paths = staged
    node_copy = tmp_path / "nvme/ds" / paths[3]  # as `shardfeed warm` leaves it
    node_copy.parent.mkdir(parents=True)
    shutil.copyfile(src / paths[3], node_copy)
    shutil.move(src / "data", tmp_path / "moved")  # every read must come from a tier copy
    with caplog.at_level(logging.INFO, logger="shardfeed"), open_dataset(src) as ds:
        assert_same(ds.read(0, len(ds)), expected)
        want = ["pfs"] * len(paths)  # pfs (2GB/s) before warm (1GB/s) for the hot shards
        want[3] = "nvme"
        assert sources(ds) == want
        assert ds.locations is not None and set(ds.locations.tiers) == {"nvme", "pfs", "warm"}
    assert warnings_of(caplog) == []  # a node tier without a shard is normal, not a problem


def test_missing_shared_copy_falls_back_to_next_tier_then_source(staged, tmp_path, caplog):
    src, expected, paths = staged
    (tmp_path / "pfs/ds" / paths[0]).unlink()  # hot: warm holds it too
    (tmp_path / "pfs/ds" / paths[-1]).unlink()  # only pfs held it
    with caplog.at_level(logging.WARNING, logger="shardfeed"), open_dataset(src) as ds:
        assert_same(ds.read(0, len(ds)), expected)
        assert ds.shard_source(0) == "warm"
        assert ds.shard_source(len(paths) - 1) == "source"
        assert ds.shard_source(1) == "pfs"
    messages = warnings_of(caplog)
    assert len(messages) == 2, messages
    for message, rel in zip(messages, (paths[0], paths[-1]), strict=True):
        assert "'pfs'" in message and rel in message and "missing" in message
        assert str(tmp_path / "pfs/ds" / rel) in message


def test_wrong_size_copies_fall_back(staged, tmp_path, caplog):
    src, expected, paths = staged
    node_copy = tmp_path / "nvme/ds" / paths[0]
    node_copy.parent.mkdir(parents=True)
    node_copy.write_bytes((src / paths[0]).read_bytes() + b"x")  # a grown node copy
    pfs_copy = tmp_path / "pfs/ds" / paths[0]
    pfs_copy.write_bytes(pfs_copy.read_bytes()[:-100])  # a truncated shared copy
    with caplog.at_level(logging.WARNING, logger="shardfeed"), open_dataset(src) as ds:
        assert ds.shard_source(0) == "warm"
        assert_same(ds.read(0, len(ds)), expected)
    messages = warnings_of(caplog)
    assert len(messages) == 2, messages
    assert "'nvme'" in messages[0] and paths[0] in messages[0] and "size" in messages[0]
    assert "'pfs'" in messages[1] and paths[0] in messages[1] and "size" in messages[1]


def test_same_size_corruption_found_on_read_falls_back(staged, tmp_path, caplog):
    src, expected, paths = staged
    pfs_copy = tmp_path / "pfs/ds" / paths[-1]
    data = bytearray(pfs_copy.read_bytes())
    data[len(data) // 2] ^= 0x5A  # inside a page of random bytes: its CRC no longer matches
    pfs_copy.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="shardfeed"), open_dataset(src) as ds:
        assert ds.shard_source(len(paths) - 1) == "pfs"  # the size and footer are fine
        assert_same(ds.read(0, len(ds)), expected)
        assert ds.shard_source(len(paths) - 1) == "source"
    (message,) = warnings_of(caplog)
    assert "'pfs'" in message and paths[-1] in message and "row groups" in message


@pytest.mark.parametrize("problem", ["other dataset", "not json", "unknown tier"])
def test_bad_locations_file_is_ignored_with_a_warning(staged, caplog, problem):
    src, expected, _ = staged
    path = src / LOCATIONS
    doc = json.loads(path.read_text())
    if problem == "other dataset":
        doc["dataset"]["fingerprint"] = "0" * len(doc["dataset"]["fingerprint"])
        path.write_text(json.dumps(doc))
    elif problem == "not json":
        path.write_text("{not json")
    else:
        doc["files"][next(iter(doc["files"]))] = ["tape"]
        path.write_text(json.dumps(doc))
    with caplog.at_level(logging.WARNING, logger="shardfeed"), open_dataset(src) as ds:
        assert ds.locations is None
        assert set(sources(ds)) == {"source"}
        assert_same(ds.read(0, len(ds)), expected)
    (message,) = warnings_of(caplog)
    assert LOCATIONS in message and "ignored" in message
    if problem == "other dataset":
        assert "written for dataset 0000" in message


def test_opting_out_reads_the_source(staged, monkeypatch, caplog):
    src, expected, _ = staged
    with open_dataset(src, use_locations=False) as ds:
        assert ds.locations is None and set(sources(ds)) == {"source"}
    monkeypatch.setenv("SHARDFEED_NO_LOCATIONS", "1")
    with open_dataset(src) as ds:
        assert set(sources(ds)) == {"source"}
        assert_same(ds.read(0, len(ds)), expected)
    monkeypatch.setenv("SHARDFEED_NO_LOCATIONS", "0")
    with open_dataset(src) as ds:
        assert set(sources(ds)) == {"pfs"}


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_inspect_json_shows_tiers_and_copies(staged, capsys):
    src, _, paths = staged
    manifest = json.loads((src / "meta/shardfeed/manifest.json").read_text())
    rc, out, err = run_cli(capsys, "inspect", "--json", str(src))
    assert rc == 0, err
    summary = json.loads(out)
    tiers = summary["tiers"]
    assert list(tiers) == ["nvme", "pfs", "warm"]  # the order readers try them
    total = sum(s["bytes"] for s in manifest["shards"])
    hot_bytes = sum(s["bytes"] for s in manifest["shards"][:HOT])
    assert tiers["pfs"] == {
        "scope": "shared",
        "uri": str(src.parent / "pfs/ds"),
        "complete": True,
        "read_bandwidth": 2 * 10**9,
        "shards": len(paths),
        "bytes": total,
    }
    assert tiers["warm"]["shards"] == HOT and tiers["warm"]["bytes"] == hot_bytes
    assert tiers["warm"]["complete"] is False
    assert tiers["nvme"]["scope"] == "node" and tiers["nvme"]["shards"] is None
    copies = [s["copies"] for s in summary["shards"]]
    assert copies == [["pfs", "warm"]] * HOT + [["pfs"]] * (len(paths) - HOT)
    assert [s["path"] for s in summary["shards"]] == paths


def test_inspect_text_shows_tiers_section(staged, capsys):
    src, _, paths = staged
    rc, out, err = run_cli(capsys, "inspect", "--shards", "-1", str(src))
    assert rc == 0, err
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("tiers"))
    rows = {line.split()[0]: line for line in lines[start + 2 : start + 5]}
    assert list(rows) == ["nvme", "pfs", "warm"]
    assert rows["pfs"].split()[1:4] == ["shared", "yes", str(len(paths))]
    assert rows["pfs"].endswith(str(src.parent / "pfs/ds"))
    assert rows["warm"].split()[1:4] == ["shared", "no", str(HOT)]
    assert "node" in rows["nvme"] and "per node, see shardfeed warm" in rows["nvme"]
    shard_lines = {line.split()[0]: line for line in lines if line.strip().startswith("data/")}
    assert shard_lines[paths[0]].endswith("pfs,warm")
    assert shard_lines[paths[-1]].endswith("pfs")


def test_inspect_without_locations_has_no_tiers(staged, capsys):
    src, _, _ = staged
    (src / LOCATIONS).unlink()
    rc, out, _ = run_cli(capsys, "inspect", "--json", str(src))
    summary = json.loads(out)
    assert rc == 0 and "tiers" not in summary
    assert all("copies" not in s for s in summary["shards"])
    rc, out, _ = run_cli(capsys, "inspect", str(src))
    assert rc == 0 and not any(line.startswith("tiers") for line in out.splitlines())
    assert "copies" not in out


def test_s3_cold_tier_serves_shards_missing_from_pfs(tmp_path, s3, caplog):
    s3, _ = s3  # the loopback server's filesystem
    src = dataset(tmp_path / "ds", hot_shards=HOT)
    stage(src, tiers_toml(tmp_path, cold=True), filesystems={"cold": s3})
    assert Locations.loads((src / LOCATIONS).read_bytes()).tiers["cold"].scope == "shared"
    with open_dataset(src, use_locations=False) as ds:
        expected = ds.read(0, len(ds))
        paths = [s.path for s in ds.shards]
    (tmp_path / "pfs/ds" / paths[-1]).unlink()
    with (
        caplog.at_level(logging.WARNING, logger="shardfeed"),
        open_dataset(src, tier_filesystems={"cold": s3}) as ds,
    ):
        assert ds.shard_source(len(paths) - 1) == "cold"
        assert_same(ds.read(0, len(ds)), expected)
        assert sources(ds)[:-1] == ["pfs"] * (len(paths) - 1)
    (message,) = warnings_of(caplog)
    assert "'pfs'" in message and paths[-1] in message
    s3.delete_file(f"bucket/datasets/ds/{paths[-1]}")  # gone from cold too: the source serves
    caplog.clear()
    with (
        caplog.at_level(logging.WARNING, logger="shardfeed"),
        open_dataset(src, tier_filesystems={"cold": s3}) as ds,
    ):
        assert ds.shard_source(len(paths) - 1) == "source"
        assert_same(ds.read(0, len(ds)), expected)
    pfs, cold = warnings_of(caplog)
    assert "'pfs'" in pfs and "'cold'" in cold
    assert f"s3://bucket/datasets/ds/{paths[-1]}" in cold and "missing" in cold


def test_loader_reads_through_tiers_falls_back_and_caches_only_shared_copies(
    staged, tmp_path, caplog
):
    from shardfeed.loader import ShardLoader
    from shardfeed.loader.schedule import schedule_reads
    from shardfeed.loader.shard_loader import _REUSE_WINDOW

    src, expected, paths = staged
    node_copy = tmp_path / "nvme/ds" / paths[1]
    node_copy.parent.mkdir(parents=True)
    shutil.copyfile(src / paths[1], node_copy)
    pfs_copy = tmp_path / "pfs/ds" / paths[-1]
    data = bytearray(pfs_copy.read_bytes())
    data[len(data) // 2] ^= 0x5A  # found only by a page checksum, in an I/O thread
    pfs_copy.write_bytes(bytes(data))
    before = {p: (tmp_path / "pfs/ds" / p).read_bytes() for p in paths}
    cache = tmp_path / "cache"
    with caplog.at_level(logging.WARNING, logger="shardfeed"):
        loader = ShardLoader(
            src, rank=0, world=1, batch_size=7, cache_dir=cache, cache_bytes=1 << 30
        )
        got = {}
        for batch in loader:
            for i, ident in enumerate(batch["id"].tolist()):
                got[ident] = bytes(batch["blob"][i])
        ds = loader.streams[0].dataset
        assert ds.shard_source(1) == "nvme"  # node tier: read in place, not cached
        assert {ds.shard_source(i) for i in range(len(paths)) if i != 1} == {"cache"}
        plan = loader.streams[0].plan  # the pass's reads, as the loader schedules them
        reads = schedule_reads(np.zeros(len(plan.shard)), plan.shard, plan.group, _REUSE_WINDOW)
        assert loader.metrics()["row_group_reads"] == len(reads.shard)
        on_node = int(np.sum(reads.shard == 1))
        assert on_node >= len(ds.shards[1].row_groups)
        ratio = loader.metrics()["cache_hit_ratio"]  # only the nvme shard was on the node
        assert ratio == on_node / len(reads.shard)
        again = ShardLoader(
            src, rank=0, world=1, batch_size=7, cache_dir=cache, cache_bytes=1 << 30
        )
        assert len(list(again)) == len(loader)
        assert again.metrics()["cache_hit_ratio"] == 1.0  # now every shard is
    assert got == dict(zip(expected["id"].tolist(), expected["blob"], strict=True))
    cached = sorted(str(p.relative_to(cache)).split("/", 2)[2] for p in cache.rglob("*.parquet"))
    assert cached == sorted(p for i, p in enumerate(paths) if i != 1)
    # the corrupt pfs copy failed its hash while being cached: the source's bytes were cached
    assert any("'pfs'" in m and paths[-1] in m for m in warnings_of(caplog))
    assert {p: (tmp_path / "pfs/ds" / p).read_bytes() for p in paths} == before
