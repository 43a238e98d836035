"""The writer lease of a dataset (``formats/writer_lease.py``) and publish as a compare-and-swap
(``formats/manifest_commit.py``), on a local file system and on a moto S3 server on loopback.

One job holds a dataset's lease; another is refused in one line naming the holder; a lease past
its term, or whose process is gone from this machine, is taken over and the job says so; a live
holder's lease never is, and a holder that lost its lease cannot publish.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest
from conftest import aws_test_env

from shardfeed.formats import manifest_commit
from shardfeed.formats.atomic import is_temp_name
from shardfeed.formats.layout import LEASE_NAME
from shardfeed.formats.manifest_commit import PublishConflictError, commit_manifest
from shardfeed.formats.store_path import StorePath
from shardfeed.formats.writer_lease import (
    LeaseHeldError,
    LeaseLostError,
    LeaseRecord,
    WriterLease,
    _boot_id,
)
from shardfeed.schemas.manifest import MANIFEST_PATH


@pytest.fixture(params=["local", "s3"])
def root(request, tmp_path, monkeypatch):
    """A dataset root on the local file system, or a fresh prefix on the module's moto S3."""
    if request.param == "local":
        return StorePath(str(tmp_path / "ds"))
    pytest.importorskip("moto.server")
    pytest.importorskip("boto3")
    host = request.getfixturevalue("s3")[1]
    for name, value in aws_test_env(tmp_path, f"http://{host}").items():
        monkeypatch.setenv(name, value)
    return StorePath.of(f"s3://bucket/lease/{tmp_path.name}/ds")


def _lease_path(root: StorePath) -> StorePath:
    return root / LEASE_NAME


def _forge(root: StorePath, **fields) -> LeaseRecord:
    """Write a lease record by hand, as another job would have left it."""
    now = time.time()
    record = LeaseRecord(
        **{
            "token": "f" * 32,
            "command": "convert",
            "host": "node-17",
            "pid": 4242,
            "boot_id": "",
            "started": now - 600,
            "renewed": now - 10,
            "expires": now + 110,
            **fields,
        }
    )
    path = _lease_path(root)
    if path.is_local:
        os.makedirs(os.path.dirname(path.local), exist_ok=True)
    path.write_bytes(record.to_bytes())
    return record


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_one_holder_a_second_is_refused_in_one_line(root):
    with WriterLease(root, "convert") as first:
        held = json.loads(_lease_path(root).read_bytes())
        assert held["pid"] == os.getpid() and held["host"] == socket.gethostname()
        with pytest.raises(LeaseHeldError) as refused:
            WriterLease(root, "stage").acquire()
        message = str(refused.value)
        assert "\n" not in message and f"pid {os.getpid()}" in message
        assert "convert on" in message and "lease until" in message and "--break-lease" in message
        first.check()  # still ours
    assert not _lease_path(root).exists()  # released
    with WriterLease(root, "stage"):
        pass


def test_an_expired_lease_is_taken_over_and_said(root):
    now = time.time()
    _forge(root, expires=now - 60, renewed=now - 180)
    with WriterLease(root, "convert") as lease:
        assert len(lease.notes) == 1
        note = lease.notes[0]
        assert "took over the writer lease of convert on node-17 pid 4242" in note
        assert "expired at" in note
        assert json.loads(_lease_path(root).read_bytes())["pid"] == os.getpid()


def test_a_lease_within_its_term_plus_skew_is_not_taken_over(root):
    now = time.time()
    _forge(root, expires=now - 1)  # past its term by less than the clock-skew allowance
    with pytest.raises(LeaseHeldError, match="node-17 pid 4242"):
        WriterLease(root, "convert").acquire()


def test_a_lease_whose_process_is_gone_from_this_machine_is_taken_over(root):
    pid = _dead_pid()
    _forge(root, host=socket.gethostname(), boot_id=_boot_id(), pid=pid)
    with WriterLease(root, "convert") as lease:
        assert f"pid {pid} on this host has exited" in lease.notes[0]


def test_a_live_process_lease_is_never_taken_over(root):
    """This process is alive: its lease (from another WriterLease) is refused, whatever the
    host check says, until its term ends."""
    _forge(root, host=socket.gethostname(), boot_id=_boot_id(), pid=os.getpid())
    with pytest.raises(LeaseHeldError):
        WriterLease(root, "convert").acquire()


def test_break_lease_takes_a_live_lease_and_its_holder_cannot_publish(root):
    holder = WriterLease(root, "convert")
    holder.acquire()
    with WriterLease(root, "convert", break_lease=True) as breaker:
        assert "broken with --break-lease" in breaker.notes[0]
        with pytest.raises(LeaseLostError, match="nothing was published"):
            holder.check()
        holder.renew()  # a renewal does not steal it back
        breaker.check()
        with pytest.raises(LeaseLostError):
            commit_manifest(root, b"{}", holder)
    holder.release()  # releasing a lost lease leaves the new holder's alone (it is gone too)


def test_an_unreadable_lease_is_refused_unless_broken(root):
    path = _lease_path(root)
    if path.is_local:
        os.makedirs(os.path.dirname(path.local), exist_ok=True)
    path.write_bytes(b"\x00garbage")
    with pytest.raises(LeaseHeldError, match="not a readable shardfeed lease"):
        WriterLease(root, "convert").acquire()
    with WriterLease(root, "convert", break_lease=True) as lease:
        assert "unreadable" in lease.notes[0]


def test_the_holder_renews_its_lease(root):
    with WriterLease(root, "convert", seconds=2.0) as lease:
        first = json.loads(_lease_path(root).read_bytes())
        time.sleep(1.6)  # renewals every half second (a quarter of the term)
        later = json.loads(_lease_path(root).read_bytes())
        assert later["token"] == first["token"] and later["expires"] > first["expires"]
        time.sleep(1.0)  # past the first term: still ours, still held
        lease.check()
        with pytest.raises(LeaseHeldError):
            WriterLease(root, "convert", seconds=2.0).acquire()


def test_a_lease_not_renewed_past_its_term_is_lost(root):
    clock = [time.time()]
    lease = WriterLease(root, "convert", seconds=30.0, clock=lambda: clock[0])
    lease.acquire()
    clock[0] += 31.0  # the renewals never came (a paused process, a store out of reach)
    with pytest.raises(LeaseLostError, match="could not be renewed"):
        lease.check()
    lease.release()


def test_the_lease_term_setting_is_bounded(monkeypatch, tmp_path):
    from shardfeed.schemas.errors import ShardfeedError

    monkeypatch.setenv("SHARDFEED_LEASE_SECONDS", "0.5")
    with pytest.raises(ShardfeedError, match=r"outside 2\.\.86400"):
        WriterLease(StorePath(str(tmp_path / "ds")), "convert")


# --------------------------------------------------------------------------------------------
# publish as a compare-and-swap


def test_the_manifest_is_committed_only_where_none_is(root):
    with WriterLease(root, "convert") as lease:
        commit_manifest(root, b'{"a": 1}', lease)
        assert (root / MANIFEST_PATH).read_bytes() == b'{"a": 1}'
        with pytest.raises(PublishConflictError, match="left as it was"):
            commit_manifest(root, b'{"b": 2}', lease)
    assert (root / MANIFEST_PATH).read_bytes() == b'{"a": 1}'
    if root.is_local:  # no temporary left beside it
        assert os.listdir(os.path.dirname((root / MANIFEST_PATH).local)) == ["manifest.json"]


def test_a_commit_killed_after_its_link_leaves_its_temporary_in_the_work_dir(tmp_path, monkeypatch):
    """A run killed between the link and the temporary's removal (the crash suite hit it once):
    the temporary is in the work directory, which a published dataset may keep and verify does
    not judge, never beside the manifest, where verify reports a leftover."""
    root = StorePath(str(tmp_path / "ds"))
    work = root / ".shardfeed-work"
    monkeypatch.setattr(manifest_commit.os, "unlink", lambda path: None)  # dies right after
    commit_manifest(root, b"{}", None, work)
    monkeypatch.undo()
    assert os.listdir(os.path.dirname((root / MANIFEST_PATH).local)) == ["manifest.json"]
    assert [name for name in os.listdir(work.local) if is_temp_name(name)]


def test_a_commit_whose_answer_was_lost_counts_as_done(proxy, tmp_path, monkeypatch):
    """S3 wrote the manifest but the answer never came: the retry is refused (the key exists),
    and the object's ETag shows it is this job's own manifest."""
    from shardfeed.formats import retry

    for name, value in aws_test_env(tmp_path, f"http://{proxy.host}").items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv(retry.BACKOFF_ENV, "0.01")
    root = StorePath.of("s3://bucket/lease/lost-answer/ds")
    dropped = []

    def drop_the_manifest_put(request, port):
        if request.method == "PUT" and request.key.endswith(MANIFEST_PATH) and not dropped:
            dropped.append(request)
            return "drop_after"
        return None

    proxy.hook = drop_the_manifest_put
    try:
        with WriterLease(root, "convert") as lease:
            commit_manifest(root, b'{"mine": true}', lease)
    finally:
        proxy.hook = None
    assert dropped and (root / MANIFEST_PATH).read_bytes() == b'{"mine": true}'


def test_assign_and_hot_hold_the_dataset_s_lease(make_small_dataset, tmp_path):
    """assign and hot write into a dataset: while another job holds its lease they are refused,
    and they leave no lease behind."""
    from shardfeed.assignment import plan_assignment
    from shardfeed.hot import build_hot_index
    from shardfeed.planning.assign import World

    root, _, _ = make_small_dataset(n=200)
    plan = plan_assignment(root, World(nodes=1, gpus_per_node=2), name="held")
    (tmp_path / "weights.csv").write_text("index,weight\n0,1\n5,2\n")
    hot = build_hot_index(root, weights=str(tmp_path / "weights.csv"))
    with WriterLease(StorePath(str(root)), "convert"):
        with pytest.raises(LeaseHeldError, match="convert on"):
            plan.save()
        with pytest.raises(LeaseHeldError, match="convert on"):
            hot.save()
    plan.save()
    hot.save()
    assert not (root / LEASE_NAME).exists()


def test_a_killed_attempt_s_temporary_is_removed_by_the_next_holder(tmp_path):
    """A process killed while writing its lease record leaves an empty temporary beside the
    lease; the next holder removes it (verify refuses temporaries in a dataset)."""
    from shardfeed.formats.atomic import temp_name

    root = StorePath(str(tmp_path / "ds"))
    os.makedirs(root.local)
    left = temp_name(os.path.join(root.local, LEASE_NAME))
    open(left, "wb").close()
    with WriterLease(root, "stage"):
        assert not os.path.exists(left)
    assert os.listdir(root.local) == []


def test_a_lease_taken_after_waiting_runs_a_full_term_from_then(tmp_path):
    """A job that waited for the holder to let go gets a whole term from the moment it takes
    the lease, not from when it began to wait (else others could take it over at once)."""
    root = StorePath(str(tmp_path / "ds"))
    clock = [1_000_000.0]
    holder = WriterLease(root, "stage", seconds=30.0)
    holder.acquire()
    waiter = WriterLease(root, "stage", seconds=30.0, wait=5.0, clock=lambda: clock[0])

    def let_go_later():
        time.sleep(0.3)
        clock[0] += 100.0  # the waiter's clock moved on while it waited
        holder.release()

    import threading

    threading.Thread(target=let_go_later).start()
    waiter.acquire()
    record = json.loads(_lease_path(root).read_bytes())
    assert record["started"] == clock[0] and record["expires"] == clock[0] + 30.0
    waiter.release()


def test_another_attempt_s_lease_temporary_is_not_content(tmp_path):
    """Two converts started together: while one links its lease, the other's temporary can sit
    beside it. The holder must not read that temporary as files in DST (a CI run saw the race
    refuse the holder with "already holds files"); a real stray file is still refused.
    ``WriteShardedDataset``'s own early check: ``tests/test_write_sharded.py``."""
    from shardfeed.formats.atomic import temp_name
    from shardfeed.formats.publish import DatasetExistsError, prepare_root

    dst = tmp_path / "dst"
    dst.mkdir()
    (dst / LEASE_NAME).write_text("{}")
    open(temp_name(str(dst / LEASE_NAME)), "wb").close()
    prepare_root(str(dst), overwrite=False)
    stray = tmp_path / "stray"
    stray.mkdir()
    (stray / "notes.txt").write_text("mine")
    with pytest.raises(DatasetExistsError, match="already holds files"):
        prepare_root(str(stray), overwrite=False)
