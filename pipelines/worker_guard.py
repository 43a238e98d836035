"""Beam SDK worker processes end with the driver that started them.

Under ``--direct_running_mode=multi_processing`` the driver starts each SDK worker through
``/bin/sh -c``; when the driver is killed with SIGKILL, the workers can outlive it (RELIABILITY.md,
"Crash injection") and go on writing while the next run takes over the dataset's lease. The
driver names itself in the environment its workers inherit (:func:`mark_driver`); the first
shardfeed step a worker runs (:func:`guard_worker`) starts a thread that ends the worker process
once that driver is gone. Only a descendant of the named driver watches it: the driver itself and
processes it did not start (Dask workers of a cluster started earlier) are left alone. A worker
that never ran a shardfeed step has no watch, and never wrote anything either.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time

DRIVER_ENV = "SHARDFEED_DRIVER"
POLL_SECONDS = 0.5
_PR_SET_PDEATHSIG = 1

_guarded = False
_lock = threading.Lock()


def mark_driver() -> None:
    """Name this process as the driver its SDK worker processes watch: ``pid:start time``."""
    os.environ[DRIVER_ENV] = f"{os.getpid()}:{process_start(os.getpid())}"


def guard_worker() -> None:
    """In an SDK worker process of a marked driver, start (once) the thread that exits the
    process when the driver is gone; anywhere else, nothing."""
    global _guarded
    with _lock:
        if _guarded:
            return
        _guarded = True
    pid_text, _, started = os.environ.get(DRIVER_ENV, "").partition(":")
    if not pid_text.isdigit() or int(pid_text) not in _ancestors():
        return  # the driver itself, or a process no marked driver started
    pid = int(pid_text)
    thread = threading.Thread(
        target=_watch, args=(pid, started), name="shardfeed-driver-watch", daemon=True
    )
    thread.start()


def _watch(pid: int, started: str) -> None:
    while True:
        time.sleep(POLL_SECONDS)
        if process_start(pid) != started:  # gone, or its pid now names another process
            os._exit(1)


def _ancestors(levels: int = 4) -> list[int]:
    """This process's parent, grandparent ... (an SDK worker's driver is two up: Beam starts it
    through ``/bin/sh -c``)."""
    found, pid = [], os.getpid()
    for _ in range(levels):
        pid = _parent(pid)
        if pid <= 1:
            break
        found.append(pid)
    return found


def _parent(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return int(handle.read().rpartition(")")[2].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def process_start(pid: int) -> str:
    """A process's start time in clock ticks since boot (``/proc/PID/stat`` field 22); "" when
    there is no such process (or no /proc)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            stat = handle.read()
    except OSError:
        return ""
    fields = stat.rpartition(")")[2].split()  # the command name may hold spaces or parentheses
    return fields[19] if len(fields) > 19 else ""


def die_with_parent(parent: int) -> None:
    """Have the kernel kill this process when its parent, ``parent``, ends (Linux
    ``PR_SET_PDEATHSIG``); exit now when it has already ended. Elsewhere, nothing."""
    if sys.platform != "linux":  # pragma: no cover
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # it ended before the call
        os._exit(1)
