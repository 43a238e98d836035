"""One writer per dataset, end to end: two ``convert`` runs into one DST at many moments of the
first one's run, a writer killed with SIGKILL, a live writer across several lease terms, and
``stage``/``warm`` into one tier; on a local file system and on a moto S3 server on loopback.

Each run is a real CLI process. To start the second writer at a precise moment, both are
started ahead with everything imported, and wait for a go file (``_Waiting``).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow.fs as pafs
import pytest
from conftest import aws_test_env

from shardfeed import open_dataset
from shardfeed.formats.layout import LEASE_NAME
from shardfeed.formats.store_path import StorePath
from shardfeed.formats.verify import verify_dataset
from shardfeed.formats.writer_lease import LeaseHeldError, WriterLease
from shardfeed.schemas.manifest import MANIFEST_PATH

#: a CLI process with everything imported, that runs ``main(argv)`` once its go file exists
WAITER = """
import os, sys, time
import shardfeed.pipelines.driver, shardfeed.staging, shardfeed.warming
from shardfeed.cli.main import main
go = sys.argv[1]
while not os.path.exists(go):
    time.sleep(0.002)
sys.exit(main(sys.argv[2:]))
"""
CONVERT = ["--target-shard-size", "40KB", "--from", "jsonl"]
CLI = [sys.executable, "-m", "shardfeed.cli.main"]


class _Waiting:
    """A CLI run started ahead, released by :meth:`go`."""

    def __init__(self, argv: list[str], scratch: Path, env: dict[str, str] | None = None) -> None:
        self.go_file = scratch / f"go-{time.monotonic_ns()}"
        self.proc = subprocess.Popen(
            [sys.executable, "-c", WAITER, str(self.go_file), *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )

    def go(self) -> None:
        self.go_file.write_text("")

    def finish(self, timeout: float = 180) -> tuple[int, str, str]:
        out, err = self.proc.communicate(timeout=timeout)
        return self.proc.returncode, out, err


def _corpus(root: Path, name: str, n: int) -> Path:
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "part.jsonl", "w") as handle:
        for i in range(n):
            handle.write(json.dumps({"id": f"{name}-{i}", "text": "x" * 200}) + "\n")
    return folder


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    root = tmp_path_factory.mktemp("writers")
    return {"a": (_corpus(root, "a", 4000), 4000), "b": (_corpus(root, "b", 6000), 6000)}


def _wait_for(probe: Callable[[], bool], proc: subprocess.Popen, limit: float = 60) -> bool:
    """Poll ``probe`` until it holds (True) or the process ended first (False)."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if probe():
            return True
        if proc.poll() is not None:
            return probe()
        time.sleep(0.002)
    raise AssertionError("the first writer never reached the moment")


def _holder_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.startswith("shardfeed:")]
    assert len(lines) == 1, err
    assert "Traceback" not in err, err
    return lines[0]


def _ids(dst: str, filesystem=None) -> list[str]:
    ds = open_dataset(dst, filesystem=filesystem)
    return sorted(ds.read(0, len(ds))["id"])


def _local_moments(dst: Path) -> dict[str, Callable[[], bool]]:
    """Moments of the first writer's run, seen from the file system."""
    return {
        "together": lambda: True,
        "lease taken": lambda: (dst / LEASE_NAME).exists(),
        "scanning": lambda: (dst / ".shardfeed-work").exists(),
        "writing shards": lambda: any((dst / "data").glob("chunk-*/*.parquet")),
        "before publish": lambda: (dst / "meta" / "info.json").exists(),
    }


def _race(
    first: _Waiting, second: _Waiting, moment: Callable[[], bool]
) -> tuple[tuple[int, str, str], tuple[int, str, str]]:
    first.go()
    _wait_for(moment, first.proc)
    second.go()
    return first.finish(), second.finish()


def _judge(results: dict[str, tuple[int, str, str]], corpora, read_ids) -> str:
    """Exactly one run succeeded; the other said in one line who holds DST; DST holds exactly
    the winner's samples and verifies. Returns the winner."""
    winners = [name for name, (code, _, _) in results.items() if code == 0]
    assert len(winners) == 1, {k: (v[0], v[2][-500:]) for k, v in results.items()}
    winner = winners[0]
    loser = "b" if winner == "a" else "a"
    line = _holder_line(results[loser][2])
    if "already holds a dataset" in line:  # it came after the winner had published
        assert winner == "a", line
    else:
        assert "is being written by another job (convert on" in line, line
        assert "pid" in line and "lease until" in line and "--break-lease" in line
    n = corpora[winner][1]
    assert read_ids() == sorted(f"{winner}-{i}" for i in range(n))
    return winner


@pytest.mark.parametrize("offset", [0.0, 0.3])
@pytest.mark.parametrize(
    "moment", ["together", "lease taken", "scanning", "writing shards", "before publish"]
)
def test_two_converts_into_one_dst_never_both_succeed(tmp_path, corpora, moment, offset):
    """The second run starts at a moment of the first one's run (then ``offset`` s later):
    never do both succeed; the loser names the holder in one line (or, once the winner has
    published, says DST holds a dataset); the winner's dataset verifies and holds exactly its
    samples."""
    dst = tmp_path / "dst"
    runs = {
        name: _Waiting(["convert", str(corpora[name][0]), str(dst), *CONVERT], tmp_path)
        for name in ("a", "b")
    }
    seen = _local_moments(dst)[moment]

    def at_moment() -> bool:
        if not seen():
            return False
        time.sleep(offset)
        return True

    first, second = _race(runs["a"], runs["b"], at_moment)
    _judge({"a": first, "b": second}, corpora, lambda: _ids(str(dst)))
    assert verify_dataset(dst).ok
    assert not (dst / LEASE_NAME).exists()


def test_a_killed_writer_s_lease_is_taken_over_and_said(tmp_path, corpora):
    """SIGKILL while writing shards: the lease stays; the next run sees its process is gone
    from this machine, takes it over, says so, and publishes."""
    dst = tmp_path / "dst"
    run = _Waiting(["convert", str(corpora["a"][0]), str(dst), *CONVERT], tmp_path)
    run.go()
    assert _wait_for(_local_moments(dst)["writing shards"], run.proc)
    run.proc.send_signal(signal.SIGKILL)
    run.finish()
    left = json.loads((dst / LEASE_NAME).read_text())
    assert left["pid"] == run.proc.pid
    proc = subprocess.run(
        [*CLI, "convert", str(corpora["b"][0]), str(dst), *CONVERT],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr
    said = f"took over the writer lease of convert on {socket.gethostname()} pid {run.proc.pid}"
    assert said in proc.stdout and f"pid {run.proc.pid} on this host has exited" in proc.stdout
    assert _ids(str(dst)) == sorted(f"b-{i}" for i in range(6000))
    assert verify_dataset(dst).ok


def test_a_live_writer_keeps_its_lease_across_many_terms(tmp_path):
    """With a 2 s lease, a conversion of several seconds renews it (every term / 4): the lease
    file's expiry moves on while the run lasts, every attempt to take the lease meanwhile is
    refused, and the run publishes. Judged by the renewals seen, not by how long the run took."""
    big = _corpus(tmp_path, "big", 60_000)
    dst = tmp_path / "dst"
    env = {**os.environ, "SHARDFEED_LEASE_SECONDS": "2"}
    run = _Waiting(["convert", str(big), str(dst), *CONVERT], tmp_path, env)
    run.go()
    assert _wait_for(_local_moments(dst)["lease taken"], run.proc)
    refused, expiries = 0, []
    while run.proc.poll() is None:
        with contextlib.suppress(FileNotFoundError, ValueError):  # mid-rename, or released
            expiries.append(json.loads((dst / LEASE_NAME).read_text())["expires"])
        try:
            with WriterLease(StorePath(str(dst)), "probe", seconds=2.0):
                # free only once the writer published and let it go (its process may still
                # be exiting)
                assert (dst / MANIFEST_PATH).exists(), "a live writer's lease was taken over"
        except LeaseHeldError:
            refused += 1
        time.sleep(0.1)
    code, _, err = run.finish()
    assert code == 0, err
    renewals = len(set(expiries)) - 1
    assert renewals >= 2 and refused >= 4, (renewals, refused, expiries)
    assert expiries == sorted(expiries)  # each renewal moves the expiry on
    assert verify_dataset(dst).ok


# --------------------------------------------------------------------------------------------
# the same on S3: the lease is a conditional put


@pytest.fixture
def s3_env(s3, tmp_path, monkeypatch):
    env = aws_test_env(tmp_path, f"http://{s3[1]}")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return {**os.environ, **env}


def _s3_moments(fs: pafs.FileSystem, prefix: str) -> dict[str, Callable[[], bool]]:
    def exists(key: str) -> bool:
        return fs.get_file_info(f"bucket/{prefix}/{key}").type != pafs.FileType.NotFound

    def shards() -> bool:
        selector = pafs.FileSelector(f"bucket/{prefix}/data", recursive=True, allow_not_found=True)
        return any(info.path.endswith(".parquet") for info in fs.get_file_info(selector))

    return {
        "together": lambda: True,
        "lease taken": lambda: exists(LEASE_NAME),
        "writing shards": shards,
    }


@pytest.mark.parametrize("moment", ["together", "lease taken", "writing shards"])
def test_two_converts_into_one_s3_dst_never_both_succeed(s3, s3_env, tmp_path, corpora, moment):
    fs = s3[0]
    prefix = f"writers/{moment.replace(' ', '-')}"
    dst = f"s3://bucket/{prefix}"
    runs = {
        name: _Waiting(["convert", str(corpora[name][0]), dst, *CONVERT], tmp_path, s3_env)
        for name in ("a", "b")
    }
    first, second = _race(runs["a"], runs["b"], _s3_moments(fs, prefix)[moment])
    _judge({"a": first, "b": second}, corpora, lambda: _ids(dst))
    assert verify_dataset(dst).ok
    assert fs.get_file_info(f"bucket/{prefix}/{LEASE_NAME}").type == pafs.FileType.NotFound


def test_a_killed_writer_s_lease_on_s3_is_taken_over(s3, s3_env, tmp_path, corpora):
    fs = s3[0]
    prefix = "writers/killed"
    dst = f"s3://bucket/{prefix}"
    run = _Waiting(["convert", str(corpora["a"][0]), dst, *CONVERT], tmp_path, s3_env)
    run.go()
    assert _wait_for(_s3_moments(fs, prefix)["writing shards"], run.proc)
    run.proc.send_signal(signal.SIGKILL)
    run.finish()
    with fs.open_input_stream(f"bucket/{prefix}/{LEASE_NAME}") as handle:
        assert json.loads(handle.read())["pid"] == run.proc.pid
    proc = subprocess.run(
        [*CLI, "convert", str(corpora["b"][0]), dst, *CONVERT],
        capture_output=True,
        text=True,
        timeout=180,
        env=s3_env,
    )
    assert proc.returncode == 0, proc.stderr
    assert f"took over the writer lease of convert on {socket.gethostname()}" in proc.stdout
    assert _ids(dst) == sorted(f"b-{i}" for i in range(6000))


# --------------------------------------------------------------------------------------------
# stage and warm into one tier


def _tier_run_refuses_a_second(
    argv: list[str], tmp_path: Path, leased: Callable[[], bool], second: Callable[[], object]
) -> None:
    """Start ``argv``; once its lease on the tier's copy exists, ``second()`` must be refused
    naming it; then the first run succeeds."""
    from shardfeed.staging import StageLockedError

    run = _Waiting(argv, tmp_path)
    run.go()
    assert _wait_for(leased, run.proc), "the first run ended before it took the lease"
    with pytest.raises(StageLockedError) as refused:
        second()
    message = str(refused.value)
    assert f"pid {run.proc.pid}" in message and "\n" not in message
    code, _, err = run.finish()
    assert code == 0, err


def test_two_stages_into_one_tier(tmp_path):
    from staging_fixtures import dataset, tiers_toml

    from shardfeed.staging import stage

    src = dataset(tmp_path / "ds", n=400, size=400_000)  # ~160 MB: a second or two to copy
    config = tiers_toml(tmp_path, cold=False)
    _tier_run_refuses_a_second(
        ["stage", str(src), "--tiers", str(config), "--tier", "pfs"],
        tmp_path,
        lambda: (tmp_path / "pfs/ds" / LEASE_NAME).exists(),
        lambda: stage(src, config, only=("pfs",)),
    )
    assert verify_dataset(tmp_path / "pfs/ds").ok
    assert not (tmp_path / "pfs/ds" / LEASE_NAME).exists()


def test_two_warms_into_one_node_tier(tmp_path):
    from staging_fixtures import dataset, tiers_toml

    from shardfeed.warming import warm

    src = dataset(tmp_path / "ds", n=400, size=400_000, hot_shards=8)
    config = tiers_toml(tmp_path, cold=False)
    _tier_run_refuses_a_second(
        ["warm", str(src), "--tiers", str(config), "--node-rank", "0", "--nodes", "1"],
        tmp_path,
        lambda: (tmp_path / "nvme/ds" / LEASE_NAME).exists(),
        lambda: warm(src, config, node_rank=0, nodes=1),
    )
    assert any((tmp_path / "nvme/ds/data").rglob("*.parquet"))


def test_two_stages_into_one_s3_tier(s3, s3_env, tmp_path):
    from staging_fixtures import dataset, tiers_toml

    from shardfeed.staging import stage

    fs = s3[0]
    src = dataset(tmp_path / "tierds", n=400, size=400_000)
    config = tiers_toml(tmp_path)
    lease = f"bucket/datasets/tierds/{LEASE_NAME}"
    _tier_run_refuses_a_second(
        ["stage", str(src), "--tiers", str(config), "--tier", "cold"],
        tmp_path,
        lambda: fs.get_file_info(lease).type == pafs.FileType.File,
        lambda: stage(src, config, only=("cold",)),
    )
    assert verify_dataset("s3://bucket/datasets/tierds", filesystem=fs).ok
    assert fs.get_file_info(lease).type == pafs.FileType.NotFound
    manifest = f"bucket/datasets/tierds/{MANIFEST_PATH}"
    assert fs.get_file_info(manifest).type == pafs.FileType.File


# --------------------------------------------------------------------------------------------
# publish as a compare-and-swap; --overwrite names what it replaces; readers never wait


@pytest.mark.parametrize("where", ["local", "s3"])
def test_a_manifest_published_meanwhile_is_left_as_it_was(
    where, tmp_path, corpora, monkeypatch, capsys, request
):
    """Another job published at DST while this one ran (its lease broken): this job's publish
    refuses in one line and the other job's manifest stays exactly as it was."""
    from shardfeed.cli.main import main
    from shardfeed.pipelines import driver

    if where == "s3":
        request.getfixturevalue("s3_env")
        dst = "s3://bucket/writers/cas"
    else:
        dst = str(tmp_path / "dst")
    theirs = b'{"published": "by another job"}'
    real = driver.commit_manifest

    def another_job_publishes_first(target, body, lease, *scratch):
        (target / MANIFEST_PATH).write_bytes(theirs)
        return real(target, body, lease, *scratch)

    monkeypatch.setattr(driver, "commit_manifest", another_job_publishes_first)
    assert main(["convert", str(corpora["a"][0]), dst, *CONVERT]) == 1
    line = _holder_line(capsys.readouterr().err)
    assert "gained a manifest from another job" in line and "nothing of this run" in line
    assert (StorePath.of(dst) / MANIFEST_PATH).read_bytes() == theirs


def test_overwrite_names_the_version_it_replaces(tmp_path, corpora, capsys):
    from shardfeed.cli.main import main

    dst = str(tmp_path / "dst")
    assert main(["convert", str(corpora["a"][0]), dst, *CONVERT]) == 0
    old = open_dataset(dst).manifest
    capsys.readouterr()
    assert main(["convert", str(corpora["b"][0]), dst, *CONVERT, "--overwrite"]) == 0
    out = capsys.readouterr().out
    want = f"replaced the published version {old.fingerprint[:16]} (4,000 samples in "
    assert want in out and f"{len(old.shards)} shards)" in out
    assert _ids(dst) == sorted(f"b-{i}" for i in range(6000))


def test_readers_never_take_the_lease_nor_wait_for_it(tmp_path, corpora):
    """While a writer holds a published dataset's lease (an assign, say), inspect, verify and
    the loader read it as usual."""
    from shardfeed.cli.main import main
    from shardfeed.loader import ShardLoader

    dst = tmp_path / "dst"
    assert main(["convert", str(corpora["a"][0]), str(dst), *CONVERT]) == 0
    with WriterLease(StorePath(str(dst)), "assign"):
        assert main(["inspect", str(dst)]) == 0
        assert verify_dataset(dst).ok
        seen = [
            i
            for batch in ShardLoader(str(dst), rank=0, world=1, batch_size=500)
            for i in batch["id"]
        ]
        assert sorted(seen) == sorted(f"a-{i}" for i in range(4000))
        assert (dst / LEASE_NAME).exists()


def test_a_killed_writer_s_lease_on_another_node_expires_then_is_taken_over(tmp_path, corpora):
    """A writer on another node (its host rewritten so: this machine cannot see its process)
    killed with SIGKILL: its lease is honoured until its term and the skew allowance pass,
    then the next run takes it over and says it expired."""
    from shardfeed.formats.writer_lease import SKEW_SECONDS

    dst = tmp_path / "dst"
    env = {**os.environ, "SHARDFEED_LEASE_SECONDS": "4"}
    run = _Waiting(["convert", str(corpora["a"][0]), str(dst), *CONVERT], tmp_path, env)
    run.go()
    assert _wait_for(_local_moments(dst)["scanning"], run.proc)
    run.proc.send_signal(signal.SIGKILL)
    run.finish()
    lease = dst / LEASE_NAME
    record = json.loads(lease.read_text())
    record["host"] = "another-node"
    lease.write_text(json.dumps(record))
    argv = [*CLI, "convert", str(corpora["b"][0]), str(dst), *CONVERT]
    early = subprocess.run(argv, capture_output=True, text=True, timeout=180, env=env)
    assert early.returncode == 1  # within its term (4 s, plus the skew allowance): refused
    assert "convert on another-node pid" in _holder_line(early.stderr)
    time.sleep(max(0.0, record["expires"] + SKEW_SECONDS + 0.5 - time.time()))
    late = subprocess.run(argv, capture_output=True, text=True, timeout=180, env=env)
    assert late.returncode == 0, late.stderr
    assert "took over the writer lease of convert on another-node" in late.stdout
    assert "expired at" in late.stdout
    assert _ids(str(dst)) == sorted(f"b-{i}" for i in range(6000))
