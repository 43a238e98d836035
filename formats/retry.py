"""One retry policy for every object-store call: what is transient, how long to wait, when to stop.

An object store read by thousands of loader workers at once answers some requests with
``503 SlowDown`` or ``429``, drops connections and times out others. Those are retried here with
exponential backoff and full jitter (a uniform wait in ``[0, min(cap, base * 2**attempt)]``), up
to a bounded number of attempts and a bounded total time; anything else (a missing key, a denied
request, bytes that arrived and are wrong) is raised at once. A call that still fails after its
retries raises :class:`ObjectStoreIOError`, an I/O error naming the object, the range, the
attempts and the last error, never a corruption error. Settings come from the environment:

==============================  ====================================================  =======
``SHARDFEED_IO_ATTEMPTS``       attempts per call, the first included                  10
``SHARDFEED_IO_RETRY_SECONDS``  total time a call may take with its waits               120
``SHARDFEED_IO_BACKOFF``        base of the backoff, seconds (cap: 64 times it)         0.25
``SHARDFEED_IO_TIMEOUT``        connect and request timeout of one request, seconds     60
==============================  ====================================================  =======

The CLI's ``--io-attempts``, ``--io-retry-seconds`` and ``--io-timeout`` set the same variables.
The defaults ride out a throttling burst of tens of seconds. Retries are counted per process
(:func:`retry_counts`), for ``ShardLoader.metrics()`` and verify's summary.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from shardfeed.schemas.errors import ShardfeedError

T = TypeVar("T")

ATTEMPTS_ENV = "SHARDFEED_IO_ATTEMPTS"
SECONDS_ENV = "SHARDFEED_IO_RETRY_SECONDS"
BACKOFF_ENV = "SHARDFEED_IO_BACKOFF"
TIMEOUT_ENV = "SHARDFEED_IO_TIMEOUT"

# words of the errors pyarrow's AWS SDK and curl put in their messages for a transient failure;
# "Failed to flush response stream" is the SDK writing an error body (SlowDown's XML) into a
# ranged read's buffer too small for it, reported as INTERNAL_FAILURE and never retried by it
_TRANSIENT_WORDS = (
    "slowdown",
    "slow down",
    "throttl",
    "toomanyrequests",
    "too many requests",
    "serviceunavailable",
    "service unavailable",
    "internalerror",
    "internal error",
    "failed to flush response stream",
    "internal failure",  # the SDK's INTERNAL_FAILURE: a response stream that broke (a cut body)
    "requesttimeout",
    "request timeout",
    "timed out",
    "timeout was reached",
    "connection reset",
    "connection refused",
    "connection aborted",
    "connection was closed",
    "broken pipe",
    "couldn't connect",
    "could not connect",
    "empty reply",
    "recv failure",
    "send failure",
    "network connection",
    "unexpected eof",
    "premature",
    "incomplete",
    "partial file",
    "http status 500",
    "http status 502",
    "http status 503",
    "http status 504",
    "http status 429",
    "http response code: 5",
    "http response code: 429",
    "http status code 5",
)
_STATUS_CODES = {429, 500, 502, 503, 504}
_BOTO_CODES = {
    "SlowDown",
    "Throttling",
    "ThrottlingException",
    "TooManyRequests",
    "RequestTimeout",
    "RequestTimeoutException",
    "InternalError",
    "ServiceUnavailable",
    "503",
    "500",
}


class ShortReadError(OSError):
    """A body ended before its length: the connection was cut midway; the read is retried."""


class ObjectStoreIOError(ShardfeedError, OSError):
    """An object-store call that still failed after its retries (or failed for good at once)."""


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 10
    total_seconds: float = 120.0
    base: float = 0.25

    @property
    def cap(self) -> float:
        return self.base * 64

    @classmethod
    def from_env(cls) -> RetryPolicy:
        """The policy the environment sets (module docstring), checked."""
        attempts = env_number(ATTEMPTS_ENV, int, cls.attempts, 1, 1000)
        seconds = env_number(SECONDS_ENV, float, cls.total_seconds, 0.0, 86_400.0)
        base = env_number(BACKOFF_ENV, float, cls.base, 0.0, 60.0)
        return cls(int(attempts), float(seconds), float(base))

    def wait(self, attempt: int, rng: random.Random) -> float:
        """Seconds to wait before attempt ``attempt + 1`` (full jitter)."""
        return rng.uniform(0.0, min(self.cap, self.base * (2.0 ** min(attempt, 30))))


def io_timeout() -> float:
    """Seconds one request may take to connect or answer (``SHARDFEED_IO_TIMEOUT``, 60)."""
    return float(env_number(TIMEOUT_ENV, float, 60.0, 0.1, 3600.0))


def env_number(name: str, kind: type, default: float, low: float, high: float) -> float:
    """Setting ``name`` from the environment as ``kind``, ``default`` when unset, refused in one
    line when it is not a number or lies outside ``low..high``."""
    text = os.environ.get(name)
    if not text:
        return default
    try:
        value = kind(text)
    except ValueError:
        raise ShardfeedError(f"{name}={text!r} is not a number") from None
    if not low <= value <= high:
        raise ShardfeedError(f"{name}={text} is outside {low:g}..{high:g}")
    return value


def is_transient(err: BaseException) -> bool:
    """Whether ``err`` is worth retrying: throttling, 5xx, dropped or refused connections,
    timeouts, a body cut short. A missing key, a denied request or bad arguments are not."""
    if isinstance(err, (FileNotFoundError, PermissionError, IsADirectoryError, ObjectStoreIOError)):
        return False  # an ObjectStoreIOError already had its retries: nested calls add none
    if isinstance(err, (ShortReadError, ConnectionError, TimeoutError)):
        return True
    response = getattr(err, "response", None)  # botocore's ClientError
    if isinstance(response, dict):
        error = response.get("Error") or {}
        status = (response.get("ResponseMetadata") or {}).get("HTTPStatusCode")
        return error.get("Code") in _BOTO_CODES or status in _STATUS_CODES
    name = type(err).__name__
    if name in {
        "EndpointConnectionError",
        "ConnectionClosedError",
        "ReadTimeoutError",
        "ConnectTimeoutError",
        "IncompleteReadError",
        "ResponseStreamingError",
        "ProtocolError",
    }:
        return True
    if isinstance(err, OSError):
        text = str(err).lower().replace("_", " ")  # the SDK's SLOW_DOWN, NETWORK_CONNECTION
        if "access denied" in text or "accessdenied" in text or "forbidden" in text:
            return False
        return any(word in text for word in _TRANSIENT_WORDS)
    return False


_COUNTS: Counter[str] = Counter()
_LOCK = threading.Lock()


def retry_counts() -> dict[str, int]:
    """Retries made in this process so far: ``retries`` (attempts repeated) and ``gave_up``."""
    with _LOCK:
        return dict(_COUNTS)


def _count(key: str) -> None:
    with _LOCK:
        _COUNTS[key] += 1


def retried(
    call: Callable[[], T],
    what: str,
    policy: RetryPolicy | None = None,
    *,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """``call()``, retried on transient errors under ``policy`` (the environment's by default).

    ``what`` names the object (and range) for the error raised when the retries run out:
    :class:`ObjectStoreIOError`, chained to the last error. A non-transient error is raised as it
    is, at once."""
    policy = policy or RetryPolicy.from_env()
    rng = random.Random()
    started = time.monotonic()
    attempt = 0
    while True:
        try:
            return call()
        except Exception as err:
            attempt += 1
            if not is_transient(err):
                raise
            delay = policy.wait(attempt - 1, rng)
            elapsed = time.monotonic() - started
            if attempt >= policy.attempts or elapsed + delay > policy.total_seconds:
                _count("gave_up")
                last = " ".join(str(err).split())[:300] or type(err).__name__
                raise ObjectStoreIOError(
                    f"{what}: failed after {attempt} attempt(s) over {elapsed:.1f} s; last error: "
                    f"{type(err).__name__}: {last}"
                ) from err
            _count("retries")
            sleep(delay)
