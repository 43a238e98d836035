"""One writer per dataset: a lease file at ``ROOT/.shardfeed-lease``, taken before anything is
written under ROOT and held, renewed, until the job publishes or fails.

The lease is created only if absent, with an operation the store makes atomic for every client:
``link(2)`` of a fully written temporary file on a local or shared POSIX file system (atomic on
NFS and on Lustre whatever its ``flock`` mount option, since it is a metadata operation, not a
lock), and a ``PutObject`` with ``If-None-Match: *`` on S3. It records who holds it (owner
token, command, host, pid, start) and until when; a background thread renews it every quarter of
its term. A lease past its term (by more than a small allowance for clock skew), or one whose
process is gone from this very machine, is taken over, and the job says so; a live writer's
lease never is: its holder renews it, and a second writer is refused in one line naming the
holder. Renewals and releases check the lease is still the holder's own (``If-Match`` on S3;
re-read before the atomic replace on POSIX), so a holder that lost it fails before publishing.
Readers never look at the lease. Stores other than S3 and POSIX (GCS, Azure) get a check then a
write, which is not atomic (docs/RELIABILITY.md).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from typing import Any

from shardfeed.formats.atomic import TMP_MARKER, temp_name
from shardfeed.formats.layout import LEASE_NAME
from shardfeed.formats.object_upload import s3_client
from shardfeed.formats.retry import env_number, retried
from shardfeed.formats.store_path import StorePath
from shardfeed.schemas.errors import ShardfeedError

_LOG = logging.getLogger(__name__)

SECONDS_ENV = "SHARDFEED_LEASE_SECONDS"
#: ``1``: every lease taken in this process breaks a live-looking holder's (``--break-lease``)
BREAK_ENV = "SHARDFEED_BREAK_LEASE"
DEFAULT_SECONDS = 120.0
#: Allowance for clocks of different hosts disagreeing, in seconds, before a lease is stale.
SKEW_SECONDS = 5.0
MAX_RECORD_BYTES = 64 << 10  # a lease file is a few hundred bytes; anything larger is not one
_ATTEMPTS = 8  # acquisition rounds when other writers race for the same lease


class LeaseHeldError(ShardfeedError):
    """Another job holds the writer lease of the dataset."""


class LeaseLostError(ShardfeedError):
    """This job's writer lease was taken over or broken while it ran; it must not publish."""


@dataclass(frozen=True)
class LeaseRecord:
    """What a lease file says: who holds it and until when (Unix seconds)."""

    token: str
    command: str
    host: str
    pid: int
    boot_id: str
    started: float
    renewed: float
    expires: float

    def to_bytes(self) -> bytes:
        return (json.dumps(asdict(self), sort_keys=True) + "\n").encode()

    @classmethod
    def from_bytes(cls, data: bytes, where: str) -> LeaseRecord:
        """A lease record, or LeaseHeldError naming a file that is not one (never overwritten
        silently: only ``--break-lease`` replaces it)."""
        try:
            if len(data) > MAX_RECORD_BYTES:
                raise ValueError("too large")
            raw = json.loads(data)
            record = cls(
                token=str(raw["token"]),
                command=str(raw["command"])[:200],
                host=str(raw["host"])[:200],
                pid=int(raw["pid"]),
                boot_id=str(raw.get("boot_id", ""))[:64],
                started=float(raw["started"]),
                renewed=float(raw["renewed"]),
                expires=float(raw["expires"]),
            )
        except (ValueError, KeyError, TypeError) as err:
            raise LeaseHeldError(
                f"{where} is not a readable shardfeed lease ({err}); if no job is writing "
                "there, pass --break-lease to replace it"
            ) from None
        return record

    def describe(self) -> str:
        """``host pid N (command) since T, lease until T'`` for messages."""
        return (
            f"{self.command} on {self.host} pid {self.pid} since {_when(self.started)}, "
            f"lease until {_when(self.expires)}"
        )

    def stale(self, now: float) -> str | None:
        """Why this lease may be taken over at ``now``, or None while it is live."""
        if now > self.expires + SKEW_SECONDS:
            return f"expired at {_when(self.expires)}"
        here = self.host == socket.gethostname() and self.boot_id == _boot_id()
        if here and not _pid_alive(self.pid):
            return f"pid {self.pid} on this host has exited"
        return None


def lease_seconds() -> float:
    """The lease term (``SHARDFEED_LEASE_SECONDS``, default 120; 2 s to a day)."""
    return float(env_number(SECONDS_ENV, float, DEFAULT_SECONDS, 2.0, 86_400.0))


class WriterLease:
    """The writer lease of the dataset at ``root``; a context manager that takes it on entry
    (raising :class:`LeaseHeldError` if another live job holds it, after waiting up to ``wait``
    seconds for it to let go) and releases it on exit.

    ``notes`` says what entry did beyond taking a free lease (a takeover, a broken lease).
    Call :meth:`check` right before publishing: it raises :class:`LeaseLostError` when the
    lease is no longer this job's."""

    def __init__(
        self,
        root: StorePath,
        command: str,
        *,
        break_lease: bool | None = None,
        seconds: float | None = None,
        wait: float = 0.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.root = root
        self.path = root / LEASE_NAME
        self.command = command
        if break_lease is None:
            break_lease = os.environ.get(BREAK_ENV) == "1"
        self.break_lease = break_lease
        self.wait = wait  # seconds to wait for a live holder to let go before refusing
        self.seconds = lease_seconds() if seconds is None else seconds
        self.clock = clock
        self.notes: list[str] = []
        self._store = _store_for(self.path)
        self._record: LeaseRecord | None = None
        self._lost: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    # --- the context -------------------------------------------------------------------------

    def __enter__(self) -> WriterLease:
        self.acquire()
        cleanup = getattr(self._store, "clean_temporaries", None)
        if cleanup is not None:
            cleanup()
        self._thread = threading.Thread(
            target=self._renew_loop, name="shardfeed-lease", daemon=True
        )
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.release()

    # --- taking, keeping, giving back ----------------------------------------------------------

    def acquire(self) -> None:
        """Take the lease: create it if absent, else take over a stale (or, with
        ``break_lease``, any) lease; raise LeaseHeldError while another job holds it."""
        now = self.clock()
        mine = LeaseRecord(
            token=secrets.token_hex(16),
            command=self.command,
            host=socket.gethostname(),
            pid=os.getpid(),
            boot_id=_boot_id(),
            started=now,
            renewed=now,
            expires=now + self.seconds,
        )
        deadline = time.monotonic() + self.wait
        rounds = 0
        while rounds < _ATTEMPTS:
            rounds += 1
            now = self.clock()  # a full term from when it is taken, however long it waited
            mine = replace(mine, started=now, renewed=now, expires=now + self.seconds)
            if self._store.create(mine):
                self._record = mine
                return
            try:
                current, version = self._store.read(str(self.path))
            except LeaseHeldError:  # not a lease record: only --break-lease replaces it
                if not self.break_lease:
                    raise
                self._store.remove()
                self.notes.append(f"{self.root}: replaced an unreadable lease (--break-lease)")
                continue
            if current is None:
                continue  # released between the two calls: try again
            if current.token == mine.token:  # our create went through; its answer was lost
                self._record = mine
                return
            why = "broken with --break-lease" if self.break_lease else current.stale(self.clock())
            if why is None and time.monotonic() < deadline:
                time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))
                rounds = 0  # waiting for the holder to let go, not racing it
                continue
            if why is None:
                raise LeaseHeldError(
                    f"{self.root} is being written by another job ({current.describe()}). "
                    "Wait for it, write to another DST, or, once sure that job is gone, pass "
                    "--break-lease"
                )
            if self._store.take_over(current, version, mine):
                self._record = mine
                note = (
                    f"{self.root}: took over the writer lease of {current.command} on "
                    f"{current.host} pid {current.pid} ({why}; it started {_when(current.started)})"
                )
                self.notes.append(note)
                _LOG.warning("%s", note)
                return
        raise LeaseHeldError(
            f"{self.root}: other jobs kept taking its writer lease; run again when they are done"
        )

    def renew(self) -> None:
        """Extend the lease by a full term; marks it lost when it is no longer ours."""
        with self._lock:
            if self._record is None or self._lost:
                return
            now = self.clock()
            fresh = replace(self._record, renewed=now, expires=now + self.seconds)
            lost = self._store.replace(self._record, fresh)
            if lost is None:
                self._record = fresh
            else:
                self._lost = lost

    def check(self) -> None:
        """Raise LeaseLostError unless the lease is still this job's and within its term."""
        with self._lock:
            record, lost = self._record, self._lost
        if record is None:
            raise LeaseLostError(f"{self.root}: this job does not hold the writer lease")
        if lost is None:
            current, _ = self._store.read(str(self.path))
            if current is None:
                lost = "its lease file is gone"
            elif current.token != record.token:
                lost = f"it is now held by {current.describe()}"
            elif self.clock() > record.expires:
                lost = f"it could not be renewed and expired at {_when(record.expires)}"
        if lost is not None:
            raise LeaseLostError(
                f"{self.root}: this job lost its writer lease ({lost}); nothing was published"
            )

    def release(self) -> None:
        """Give the lease back (only if it is still ours)."""
        with self._lock:
            record, self._record = self._record, None
        if record is not None:
            with contextlib.suppress(OSError, ShardfeedError):
                self._store.delete(record)

    def _renew_loop(self) -> None:
        interval = max(0.5, self.seconds / 4)
        while not self._stop.wait(interval):
            # the store may be unreachable for now: check() notices if the term runs out
            with contextlib.suppress(OSError, ShardfeedError):
                self.renew()


# --- stores -------------------------------------------------------------------------------------


class _PosixStore:
    """Create-if-absent by ``link(2)``, take-over by ``rename(2)`` then a check."""

    def __init__(self, path: str) -> None:
        self.path = path

    def _temp(self, record: LeaseRecord) -> str:
        temp = temp_name(self.path)  # a killed run's leftover is cleaned like any temporary
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.write(fd, record.to_bytes())
            os.fsync(fd)
        finally:
            os.close(fd)
        return temp

    def create(self, record: LeaseRecord) -> bool:
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        temp = self._temp(record)
        try:
            os.link(temp, self.path)
            return True
        except (FileExistsError, FileNotFoundError):  # taken; or a cleanup removed the temp
            return False
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temp)

    def read(self, where: str) -> tuple[LeaseRecord | None, Any]:
        try:
            with open(self.path, "rb") as handle:
                data = handle.read(MAX_RECORD_BYTES + 1)
        except FileNotFoundError:
            return None, None
        return LeaseRecord.from_bytes(data, where), None

    def take_over(self, stale: LeaseRecord, version: Any, record: LeaseRecord) -> bool:
        """Move the stale lease aside; if what moved was not it (another job took over first),
        put that back. The next round's create then races fairly."""
        grave = temp_name(self.path)
        try:
            os.rename(self.path, grave)
        except FileNotFoundError:
            return False
        try:
            with open(grave, "rb") as handle:
                moved = handle.read(MAX_RECORD_BYTES + 1)
            if LeaseRecord.from_bytes(moved, self.path).token != stale.token:
                with contextlib.suppress(FileExistsError):
                    os.link(grave, self.path)
                return False
        except (FileNotFoundError, LeaseHeldError):  # a new holder cleaned it up, or not a lease
            return False
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(grave)
        return self.create(record)

    def clean_temporaries(self) -> None:
        """Delete lease temporaries of attempts that died (a process killed while writing its
        record): called by the holder, when any other attempt in flight is bound to fail."""
        directory, name = os.path.split(self.path)
        prefix = f".{name}{TMP_MARKER}"
        with contextlib.suppress(OSError):
            for entry in os.listdir(directory):
                if entry.startswith(prefix):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(os.path.join(directory, entry))

    def replace(self, mine: LeaseRecord, fresh: LeaseRecord) -> str | None:
        current, _ = self.read(self.path)
        if current is None:
            return "its lease file is gone"
        if current.token != mine.token:
            return f"it is now held by {current.describe()}"
        temp = self._temp(fresh)
        os.replace(temp, self.path)
        return None

    def delete(self, mine: LeaseRecord) -> None:
        current, _ = self.read(self.path)
        if current is not None and current.token == mine.token:
            self.remove()

    def remove(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


class _S3Store:
    """Create with ``If-None-Match: *``; renew, take over and delete with ``If-Match``."""

    def __init__(self, path: StorePath, client: Any) -> None:
        self.display = str(path)
        self.bucket, _, self.key = path.path.partition("/")
        self.client = client
        self.etag: str | None = None

    def _put(self, record: LeaseRecord, **condition: str) -> str | None:
        """The new ETag, or None when the condition failed."""
        body = record.to_bytes()
        try:
            answer = retried(
                lambda: self.client.put_object(
                    Bucket=self.bucket, Key=self.key, Body=body, **condition
                ),
                f"put {self.display}",
            )
        except Exception as err:
            if _code(err) not in ("PreconditionFailed", "ConditionalRequestConflict"):
                raise
            try:  # refused: another job's lease, or our own put whose answer was lost
                current, etag = self.read(self.display)
            except LeaseHeldError:  # not a lease at all: not ours
                return None
            return etag if current is not None and current == record else None
        return answer["ETag"]

    def create(self, record: LeaseRecord) -> bool:
        etag = self._put(record, IfNoneMatch="*")
        self.etag = etag or self.etag
        return etag is not None

    def read(self, where: str) -> tuple[LeaseRecord | None, Any]:
        try:
            answer = retried(
                lambda: self.client.get_object(Bucket=self.bucket, Key=self.key),
                f"get {self.display}",
            )
        except Exception as err:
            if _code(err) in ("NoSuchKey", "404"):
                return None, None
            raise
        data = answer["Body"].read(MAX_RECORD_BYTES + 1)
        return LeaseRecord.from_bytes(data, where), answer["ETag"]

    def take_over(self, stale: LeaseRecord, version: Any, record: LeaseRecord) -> bool:
        etag = self._put(record, IfMatch=version)
        self.etag = etag or self.etag
        return etag is not None

    def replace(self, mine: LeaseRecord, fresh: LeaseRecord) -> str | None:
        etag = self._put(fresh, IfMatch=self.etag or "")
        if etag is not None:
            self.etag = etag
            return None
        current, _ = self.read(self.display)
        return (
            "its lease object is gone"
            if current is None
            else f"it is now held by {current.describe()}"
        )

    def delete(self, mine: LeaseRecord) -> None:
        try:
            retried(
                lambda: self.client.delete_object(
                    Bucket=self.bucket, Key=self.key, IfMatch=self.etag or ""
                ),
                f"delete {self.display}",
            )
        except Exception as err:
            code = _code(err)
            if code == "NotImplemented":  # a store without conditional deletes: check, delete
                current, _ = self.read(self.display)
                if current is not None and current.token == mine.token:
                    retried(
                        lambda: self.client.delete_object(Bucket=self.bucket, Key=self.key),
                        f"delete {self.display}",
                    )
            elif code not in ("PreconditionFailed", "NoSuchKey", "404"):
                raise

    def remove(self) -> None:
        retried(
            lambda: self.client.delete_object(Bucket=self.bucket, Key=self.key),
            f"delete {self.display}",
        )


class _OtherStore:
    """Object stores without a conditional put through pyarrow: check, then write."""

    def __init__(self, path: StorePath) -> None:
        self.path = path

    def create(self, record: LeaseRecord) -> bool:
        if self.path.exists():
            return False
        self.path.write_bytes(record.to_bytes())
        return True

    def read(self, where: str) -> tuple[LeaseRecord | None, Any]:
        try:
            return LeaseRecord.from_bytes(self.path.read_bytes(), where), None
        except FileNotFoundError:
            return None, None

    def take_over(self, stale: LeaseRecord, version: Any, record: LeaseRecord) -> bool:
        self.path.write_bytes(record.to_bytes())
        return True

    def replace(self, mine: LeaseRecord, fresh: LeaseRecord) -> str | None:
        current, _ = self.read(str(self.path))
        if current is None or current.token != mine.token:
            return "it is now held by another job" if current else "its lease file is gone"
        self.path.write_bytes(fresh.to_bytes())
        return None

    def delete(self, mine: LeaseRecord) -> None:
        current, _ = self.read(str(self.path))
        if current is not None and current.token == mine.token:
            self.path.unlink()

    def remove(self) -> None:
        self.path.unlink()


def _store_for(path: StorePath):
    if path.is_local:
        return _PosixStore(path.local)
    client = s3_client(path.filesystem)
    return _OtherStore(path) if client is None else _S3Store(path, client)


def _code(err: BaseException) -> str | None:
    response = getattr(err, "response", None)
    if not isinstance(response, dict):
        return None
    code = (response.get("Error") or {}).get("Code")
    return str(code) if code is not None else None


def _when(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _boot_id() -> str:
    """This machine's boot id (Linux), so a pid is judged only on the machine that ran it."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as handle:
            return handle.read().strip()
    except OSError:
        return ""


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's live process
    return True
