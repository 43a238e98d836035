"""SIGKILL a command at a chosen moment of its run, and time the phases of an uninterrupted run.

A command runs in a session of its own, so its process group holds it and every worker process it
starts (Beam's ``multi_processing`` SDK workers); a kill takes the whole group down at once, as a
node failure would, or only the driver, as the OOM killer would. Either way the harness waits
until no process of the group is left, so nothing orphaned keeps writing while the test inspects
what was left. Moments are named by *probes*: predicates on the output tree, given the wall-clock
time the run started, that say whether the run has reached a phase (e.g. "a shard file newer than
the start exists"). Used by ``tests/adversarial/test_crash_injection.py`` and
``tests/test_staging.py``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

#: ``probe(started)``: whether a run that started at wall-clock ``started`` reached a phase
Probe = Callable[[float], bool]

POLL_SECONDS = 0.002
#: how long workers of a killed driver get to notice and exit on their own
ORPHAN_GRACE = 3.0


def newer(root: Path, *patterns: str, files_only: bool = False) -> Probe:
    """A probe: some path under ``root`` matching one of ``patterns`` (pathlib globs; hidden
    temporary files match too; with ``files_only``, files only: a directory a deletion empties is
    newer too) was modified at or after the run started. Files an earlier, killed run left
    behind are older, so a resumed run's progress is told apart from them."""

    def probe(started: float) -> bool:
        for pattern in patterns:
            for path in matching(root, pattern):
                with contextlib.suppress(FileNotFoundError):
                    if (not files_only or path.is_file()) and path.stat().st_mtime >= started:
                        return True
        return False

    return probe


def matching(root: Path, pattern: str) -> list[Path]:
    """The paths under ``root`` matching ``pattern`` now; none of a directory the run deletes
    while it is being listed (``glob`` then raises)."""
    try:
        return list(root.glob(pattern))
    except FileNotFoundError:
        return []


@dataclass(frozen=True)
class Timeline:
    """When each probe first held in an uninterrupted run (seconds from spawn), and its exit."""

    marks: dict[str, float]
    total: float

    def windows(self, phases: Sequence[str]) -> dict[str, tuple[str | None, float]]:
        """Per phase, in run order: (the probe that opens it, None for the spawn; its length in
        seconds, up to the next phase's mark or the exit). Phases must each have been seen."""
        missing = [p for p in phases[1:] if p not in self.marks]
        if missing:
            raise AssertionError(f"the uninterrupted run never reached {missing}: {self}")
        starts = [0.0, *(self.marks[p] for p in phases[1:])]
        ends = [*starts[1:], self.total]
        return {
            phase: (None if i == 0 else phase, max(end - start, 0.0))
            for i, (phase, start, end) in enumerate(zip(phases, starts, ends, strict=True))
        }


@dataclass(frozen=True)
class Moment:
    """Kill ``delay`` seconds after probe ``after`` first holds (``None``: after the spawn)."""

    phase: str
    after: str | None
    delay: float


@dataclass(frozen=True)
class Kill:
    """What one kill did: ``exited_first`` when the run ended before the signal was due;
    ``reached``: the probes that held once the run was dead (how far *this* run got)."""

    moment: Moment
    exited_first: bool
    returncode: int
    seconds: float
    reached: tuple[str, ...]
    driver_only: bool = False
    #: worker processes still alive ``ORPHAN_GRACE`` seconds after their driver was killed
    #: (then killed by the harness)
    orphans: int = 0

    def phase(self, phases: Sequence[str]) -> str:
        """The last of ``phases`` (in run order; the first needs no probe) this run reached."""
        return [phases[0], *(p for p in phases[1:] if p in self.reached)][-1]


def _spawn(cmd: Sequence[str], env: Mapping[str, str] | None, log) -> subprocess.Popen:
    return subprocess.Popen(
        list(cmd),
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        env=None if env is None else dict(env),
        start_new_session=True,  # its own process group: workers die with it
    )


def timeline(
    cmd: Sequence[str],
    probes: Mapping[str, Probe],
    *,
    env: Mapping[str, str] | None = None,
    timeout: float = 300.0,
) -> Timeline:
    """Run ``cmd`` to completion (it must succeed), noting when each probe first held."""
    with tempfile.TemporaryFile() as log:
        started, t0 = time.time(), time.monotonic()
        process = _spawn(cmd, env, log)
        marks: dict[str, float] = {}
        try:
            while process.poll() is None:
                for name, probe in probes.items():
                    if name not in marks and probe(started):
                        marks[name] = time.monotonic() - t0
                if time.monotonic() - t0 > timeout:
                    raise TimeoutError(f"{cmd} ran over {timeout}s")
                time.sleep(POLL_SECONDS)
        finally:
            _kill_group(process)
        total = time.monotonic() - t0
        for name, probe in probes.items():  # a phase shorter than one poll still counts
            if name not in marks and probe(started):
                marks[name] = total
        if process.returncode != 0:
            log.seek(0)
            raise AssertionError(f"{cmd} failed ({process.returncode}):\n{log.read()[-4000:]!r}")
    return Timeline(marks, total)


def kill_at(
    cmd: Sequence[str],
    moment: Moment,
    probes: Mapping[str, Probe],
    *,
    env: Mapping[str, str] | None = None,
    timeout: float = 300.0,
    driver_only: bool = False,
) -> Kill:
    """Start ``cmd``, wait for ``moment``, SIGKILL its process group (``driver_only``: only the
    command's own process, as the OOM killer picks one; its workers must then exit on their own),
    and wait until every process of the group is gone. A run that ends first is reported."""
    probe = probes[moment.after] if moment.after is not None else None
    with tempfile.TemporaryFile() as log:
        started, t0 = time.time(), time.monotonic()
        process = _spawn(cmd, env, log)
        try:
            while probe is not None and process.poll() is None and not probe(started):
                if time.monotonic() - t0 > timeout:
                    raise TimeoutError(f"{cmd} never reached {moment.after!r} in {timeout}s")
                time.sleep(POLL_SECONDS)
            due = time.monotonic() + moment.delay
            while process.poll() is None and (left := due - time.monotonic()) > 0:
                time.sleep(min(POLL_SECONDS, left))
        finally:
            orphans = _kill_group(process, driver_only)
    # a run can end on its own between the last poll and the signal: only SIGKILL's status counts
    exited_first = process.returncode != -signal.SIGKILL
    reached = tuple(name for name, held in probes.items() if held(started))
    seconds = time.monotonic() - t0
    return Kill(moment, exited_first, process.returncode, seconds, reached, driver_only, orphans)


def _kill_group(process: subprocess.Popen, driver_only: bool = False) -> int:
    """SIGKILL the group (or its leader only) while the leader is still unreaped, so the group
    id is still ours; reap it and wait for the other members to go. With ``driver_only``, the
    members still alive after ``ORPHAN_GRACE`` are counted, then killed; returns that count."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            if driver_only:
                os.kill(process.pid, signal.SIGKILL)
            else:
                os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    orphans = 0
    if driver_only:
        deadline = time.monotonic() + ORPHAN_GRACE
        while (alive := _group_members(process.pid)) and time.monotonic() < deadline:
            time.sleep(0.01)
        orphans = len(alive)
        if alive:  # members remain, so the group id is still this run's
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
    wait_group_gone(process.pid)
    return orphans


def wait_group_gone(pgid: int, timeout: float = 30.0) -> None:
    """Wait until no live (non-zombie) process is left in group ``pgid``; a worker that outlives
    its killed driver would go on writing into the tree under test."""
    deadline = time.monotonic() + timeout
    while (alive := _group_members(pgid)) and time.monotonic() < deadline:
        time.sleep(0.01)
    if alive:
        raise AssertionError(f"processes {alive} of killed group {pgid} still run")


def _group_members(pgid: int) -> list[int]:
    members = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) "
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            members.append(int(entry.name))
    return members
