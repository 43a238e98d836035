"""Staging to tiers: three local directories and an S3 cold tier on a loopback moto server."""

from __future__ import annotations

import hashlib
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
from adversarial.kill_harness import Moment, kill_at
from staging_fixtures import dataset, final_files, tiers_toml

from shardfeed.cli.main import main
from shardfeed.formats.atomic import is_temp_name
from shardfeed.formats.verify import verify_dataset
from shardfeed.schemas.locations import Locations
from shardfeed.staging import CapacityError, StageLockedError, stage

moto_server = pytest.importorskip("moto.server")


def test_stage_three_local_tiers_and_s3_cold(tmp_path, s3):
    fs, _ = s3
    src = dataset(tmp_path / "ds", hot_shards=2)
    config = tiers_toml(tmp_path)
    report = stage(src, config, filesystems={"cold": fs}, workers=3)
    assert {r.tier for r in report.results} == {"pfs", "cold", "warm"}
    assert verify_dataset(tmp_path / "pfs/ds").ok  # a complete dataset on its own
    assert verify_dataset("s3://bucket/datasets/ds", filesystem=fs).ok
    manifest = json.loads((src / "meta/shardfeed/manifest.json").read_text())
    hot = [s["path"] for s in manifest["shards"][:2]]
    assert sorted(final_files(tmp_path / "warm/ds")) == sorted(hot)  # hot shards only
    assert not (tmp_path / "nvme").exists()  # node tiers are warm's job
    locations = Locations.loads((src / "meta/shardfeed/locations.json").read_bytes())
    assert locations.files[hot[0]] == ("pfs", "warm", "cold")
    assert locations.files[manifest["shards"][-1]["path"]] == ("pfs", "cold")
    assert (
        locations.tiers["cold"].uri == "s3://bucket/datasets/ds"
        and locations.tiers["cold"].complete
    )
    again = stage(src, config, filesystems={"cold": fs})
    assert all(r.copied == 0 and r.recopied == 0 and r.skipped > 0 for r in again.results)


def test_corrupt_copy_is_recopied_and_leftover_temporaries_removed(tmp_path):
    src = dataset(tmp_path / "ds")
    config = tiers_toml(tmp_path, cold=False)
    stage(src, config)
    shard = next((tmp_path / "pfs/ds/data").rglob("*.parquet"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x5A
    shard.write_bytes(bytes(data))
    leftover = shard.parent / ".file-999.parquet.tmp-0123456789abcdef"
    assert is_temp_name(leftover.name), "the test must use shardfeed's own temporary pattern"
    leftover.write_bytes(b"half a copy")
    result = {r.tier: r for r in stage(src, config).results}["pfs"]
    assert result.recopied == 1 and result.copied == 0 and result.removed_temporaries == 1
    assert not leftover.exists() and verify_dataset(tmp_path / "pfs/ds").ok


def test_capacity_is_refused_before_any_copy(tmp_path, capsys):
    src = dataset(tmp_path / "ds")
    config = tiers_toml(tmp_path, capacity="10KB", cold=False)
    with pytest.raises(CapacityError, match=r"pfs needs .* of 9\.8 KiB"):
        stage(src, config)
    assert not (tmp_path / "pfs").exists() and not (tmp_path / "warm").exists()
    assert main(["stage", str(src), "--tiers", str(config), "--dry-run"]) == 1
    assert "over capacity" in capsys.readouterr().err


def test_dry_run_plan_matches_the_real_run(tmp_path, capsys):
    src = dataset(tmp_path / "ds", hot_shards=1)
    config = tiers_toml(tmp_path, cold=False)
    assert main(["stage", str(src), "--tiers", str(config), "--dry-run", "--json"]) == 0
    planned = {t["tier"]: t for t in json.loads(capsys.readouterr().out)["plan"]}
    assert not (tmp_path / "pfs").exists()
    assert main(["stage", str(src), "--tiers", str(config), "--json"]) == 0
    done = {r["tier"]: r for r in json.loads(capsys.readouterr().out)["results"]}
    assert planned.keys() == done.keys() == {"pfs", "warm"}
    for tier, plan in planned.items():
        files = final_files(tmp_path / tier / "ds")
        assert done[tier]["copied"] == plan["files"] == len(files)
        assert done[tier]["bytes_copied"] == plan["bytes"] == sum(len(b) for b in files.values())


def test_a_second_stage_on_a_leased_tier_is_refused(tmp_path):
    """While another job holds the writer lease of the tier's copy, stage is refused in one
    line naming the holder; once it is released, stage runs."""
    from shardfeed.formats.store_path import StorePath
    from shardfeed.formats.writer_lease import WriterLease

    src = dataset(tmp_path / "ds", n=40)
    config = tiers_toml(tmp_path, cold=False)
    with WriterLease(StorePath(str(tmp_path / "pfs/ds")), "stage to tier 'pfs'"):
        with pytest.raises(StageLockedError) as refused:
            stage(src, config, only=("pfs",))
        message = str(refused.value)
        assert "tier 'pfs'" in message and "being written by another job" in message
        assert f"pid {os.getpid()}" in message and "--break-lease" in message
        assert "\n" not in message
    assert stage(src, config, only=("pfs",)).results[0].copied > 0  # released by its holder


def test_break_lease_takes_the_tier_copy_from_a_live_looking_holder(tmp_path, capsys):
    """``stage --break-lease`` goes ahead though a lease is held (the user checked its holder is
    gone); without it, the same command is refused in one line."""
    from shardfeed.cli.main import main
    from shardfeed.formats.store_path import StorePath
    from shardfeed.formats.writer_lease import BREAK_ENV, WriterLease

    src = dataset(tmp_path / "ds", n=40)
    config = tiers_toml(tmp_path, cold=False)
    argv = ["stage", str(src), "--tiers", str(config), "--tier", "pfs"]
    holder = WriterLease(StorePath(str(tmp_path / "pfs/ds")), "stage to tier 'pfs'")
    holder.acquire()
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.count("shardfeed:") == 1 and "being written by another job" in err
    assert main([*argv, "--break-lease"]) == 0
    assert BREAK_ENV not in os.environ
    with pytest.raises(Exception, match="lost its writer lease"):
        holder.check()
    assert verify_dataset(tmp_path / "pfs/ds").ok


def test_cli_reaches_s3_through_the_environment(tmp_path, s3, capsys):
    fs, host_port = s3
    endpoint = f"http://{host_port}"
    src = dataset(tmp_path / "ds", n=60)
    config = tiers_toml(tmp_path)
    env = {
        **os.environ,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": endpoint,
    }
    cmd = [
        sys.executable,
        "-m",
        "shardfeed.cli.main",
        "stage",
        str(src),
        "--tiers",
        str(config),
        "--tier",
        "cold",
    ]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "cold: copied" in done.stdout
    assert verify_dataset("s3://bucket/datasets/ds", filesystem=fs).ok


def test_sigkill_at_random_moments_never_leaves_a_partial_file(tmp_path):
    """20 stage runs killed at random moments: no file under its final name is ever partial,
    and each resume finishes with every copy verified."""
    src = dataset(tmp_path / "ds", n=500, size=200_000)  # ~120 MB in 8 shards
    config = tiers_toml(tmp_path, cold=False)
    expected = {}
    manifest = json.loads((src / "meta/shardfeed/manifest.json").read_text())
    for record in [*manifest["shards"], *manifest["files"]]:
        expected[record["path"]] = record["sha256"]
    expected["meta/shardfeed/manifest.json"] = hashlib.sha256(
        (src / "meta/shardfeed/manifest.json").read_bytes()
    ).hexdigest()
    cmd = [
        sys.executable,
        "-m",
        "shardfeed.cli.main",
        "stage",
        str(src),
        "--tiers",
        str(config),
        "--workers",
        "2",
    ]
    rng = random.Random(7)

    def copying(started: float) -> bool:  # the copying began: the tier copy's root exists
        return (tmp_path / "pfs/ds").exists()

    midway = 0  # kills that caught a copy in flight (a temporary file left behind)
    for _ in range(20):
        shutil_rmtree(tmp_path / "pfs")
        for _ in range(2):  # kill, resume-and-kill: a resume can be interrupted too
            # wait for the copying to begin, then kill at random (tests/adversarial/kill_harness.py)
            kill_at(cmd, Moment("copy", "copy", rng.uniform(0.0, 0.25)), {"copy": copying})
            midway += any(is_temp_name(p.name) for p in (tmp_path / "pfs").rglob("*"))
            for rel, data in final_files(tmp_path / "pfs/ds").items():
                assert hashlib.sha256(data).hexdigest() == expected[rel], (
                    f"partial {rel} under its final name"
                )
        assert subprocess.run(cmd, capture_output=True, timeout=120).returncode == 0
        copy = tmp_path / "pfs/ds"
        assert verify_dataset(copy).ok
        assert not [p for p in copy.rglob("*") if is_temp_name(p.name)]
    assert midway >= 5, f"only {midway} of 40 kills caught a copy in flight"


def shutil_rmtree(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)


def test_the_same_copies_run_as_a_beam_pipeline(tmp_path, capsys, monkeypatch):
    from shardfeed.pipelines import stage_copies

    src = dataset(tmp_path / "ds", n=120)
    config = tiers_toml(tmp_path, cold=False)
    args = ["stage", str(src), "--tiers", str(config), "--tier", "pfs", "--json"]
    pipelines = []  # the Beam flags each copy pipeline was given
    real = stage_copies.run_copies
    monkeypatch.setattr(
        stage_copies,
        "run_copies",
        lambda src, target, tasks, beam_args: (
            pipelines.append(beam_args) or real(src, target, tasks, beam_args)
        ),
    )
    assert main([*args, "--runner=DirectRunner", "--direct_num_workers=2"]) == 0
    assert pipelines == [["--runner=DirectRunner", "--direct_num_workers=2"]]
    out = json.loads(capsys.readouterr().out)
    (plan,), (result,) = out["plan"], out["results"]
    assert result["copied"] == plan["files"] and result["bytes_copied"] == plan["bytes"]
    assert verify_dataset(tmp_path / "pfs/ds").ok
    assert main([*args, "--runner=DirectRunner"]) == 0  # a re-run skips every verified copy
    assert json.loads(capsys.readouterr().out)["results"][0]["skipped"] == plan["files"]
    assert main([*args[:-1], "--direct_num_workers=2"]) == 2
    assert "Beam flags need --runner" in capsys.readouterr().err


#: the CLI in a process where flock fails as on a Lustre client mounted ``noflock``, and
#: reading locations.json for the merge takes 1.5 s
NOFLOCK_CLI = """
import errno, fcntl, sys
def refuse(*args, **kwargs):
    raise OSError(errno.ENOSYS, "Function not implemented (mounted noflock)")
fcntl.flock = fcntl.lockf = refuse
import time
import shardfeed.staging as staging
read = staging._existing_locations
def slow_read(*args):  # widen the read-merge-write window, so the two runs overlap in it
    found = read(*args)
    time.sleep(1.5)
    return found
staging._existing_locations = slow_read
from shardfeed.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


def test_stages_to_two_tiers_at_once_keep_both_records_without_flock(tmp_path):
    """Two stage processes, to two tiers, at once, three times, where flock fails: each
    locations.json holds both tiers (the record is merged under the source's writer lease,
    link(2)-based, not under a flock)."""
    import shutil

    src = dataset(tmp_path / "ds", n=200, size=20_000, hot_shards=2)
    config = tiers_toml(tmp_path, cold=False)
    record = src / "meta/shardfeed/locations.json"
    for _ in range(3):
        for tier in ("pfs", "warm"):
            shutil.rmtree(tmp_path / tier, ignore_errors=True)
        record.unlink(missing_ok=True)
        command = [sys.executable, "-c", NOFLOCK_CLI, "stage", str(src), "--tiers", str(config)]
        runs = [
            subprocess.Popen(
                [*command, "--tier", tier],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for tier in ("pfs", "warm")
        ]
        for run in runs:
            _, err = run.communicate(timeout=120)
            assert run.returncode == 0, err
        locations = Locations.loads(record.read_bytes(), str(record))
        assert {"pfs", "warm"} <= set(locations.tiers), locations.tiers
        assert verify_dataset(src).ok
