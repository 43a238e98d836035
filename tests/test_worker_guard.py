"""Beam SDK worker processes end with their driver (``pipelines/worker_guard.py``)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

import pytest

pytest.importorskip("apache_beam")

from shardfeed.pipelines import worker_guard

#: a driver: names itself, starts a worker through /bin/sh -c as Beam does, prints its pid
DRIVER = """
import subprocess, sys, time
from shardfeed.pipelines.worker_guard import mark_driver
mark_driver()
worker = subprocess.Popen(sys.argv[1], shell=True)
print(worker.pid, flush=True)
time.sleep(60)
"""
#: a worker that runs a shardfeed step (the guard), says so, then would idle for a minute
WORKER = (
    f"{sys.executable} -c 'import os, time; from shardfeed.pipelines.worker_guard import "
    'guard_worker; guard_worker(); open(os.environ["READY"], "w").close(); time.sleep(60)\''
)
IDLE = (
    f"{sys.executable} -c 'import os, time; "
    'open(os.environ["READY"], "w").close(); time.sleep(60)\''
)


def _descendants(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != pid:
            chain = worker_guard._parent(int(entry))
            for _ in range(3):
                if chain == pid:
                    out.append(int(entry))
                    break
                chain = worker_guard._parent(chain)
    return out


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline") as handle:
            return handle.read()
    except OSError:
        return ""


@pytest.mark.parametrize("command, ends", [(WORKER, True), (IDLE, False)])
def test_a_worker_that_ran_a_step_ends_with_its_killed_driver(command, ends, tmp_path):
    """The driver is killed with SIGKILL: the guarded worker (started through /bin/sh -c, as
    Beam starts SDK workers) exits within a few polls; the unguarded control does not."""
    ready = tmp_path / "ready"
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER, command],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "READY": str(ready)},
    )
    workers: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while not ready.exists() and time.monotonic() < deadline:  # its watch has started
            time.sleep(0.02)
        workers = _descendants(driver.pid)
        assert workers, "the worker did not start"
        driver.send_signal(signal.SIGKILL)
        driver.wait()
        deadline = time.monotonic() + 3 * worker_guard.POLL_SECONDS + 1.0
        while any(_alive(p) for p in workers) and time.monotonic() < deadline:
            time.sleep(0.05)
        python_left = [p for p in workers if _alive(p) and "python" in _cmdline(p)]
        assert (python_left == []) == ends, python_left
    finally:
        for pid in workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if driver.poll() is None:
            driver.kill()


def test_the_driver_itself_and_unrelated_processes_keep_no_watch(monkeypatch):
    monkeypatch.setenv(worker_guard.DRIVER_ENV, "")  # restored after: later tests spawn CLIs
    monkeypatch.setattr(worker_guard, "_guarded", False)
    worker_guard.mark_driver()
    started = []
    monkeypatch.setattr(worker_guard.threading, "Thread", lambda **kw: started.append(kw))
    worker_guard.guard_worker()  # this process is the driver it names
    assert started == []
    monkeypatch.setattr(worker_guard, "_guarded", False)
    monkeypatch.setenv(worker_guard.DRIVER_ENV, "1:0")  # init: an ancestor never listed
    worker_guard.guard_worker()
    assert started == []
