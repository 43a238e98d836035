"""Shared CLI plumbing: clean error reporting and a stderr progress line."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any, TextIO

from shardfeed.schemas.units import format_size

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def add_break_lease(parser: argparse.ArgumentParser, what: str = "the dataset's") -> None:
    """``--break-lease`` for a command that writes a dataset (``formats/writer_lease.py``)."""
    parser.add_argument(
        "--break-lease",
        action="store_true",
        help=f"take {what} writer lease even though another job seems to hold it; only after "
        "checking that job is gone (a crashed job's lease expires by itself: "
        "SHARDFEED_LEASE_SECONDS, default 120; at once when it ran on this machine)",
    )


def fail(message: str, code: int = EXIT_FAILED) -> int:
    print(f"shardfeed: error: {message}", file=sys.stderr)
    return code


def print_json(obj: Any, out: TextIO | None = None) -> None:
    (out or sys.stdout).write(json.dumps(obj, indent=2, ensure_ascii=False) + "\n")


class Progress:
    """A one-line byte counter on stderr, only when stderr is a terminal (never in logs or pipes)."""

    def __init__(self, total_bytes: int, label: str, stream: TextIO | None = None) -> None:
        self.total = total_bytes
        self.label = label
        self.done = 0
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty()
        self._start = time.monotonic()
        self._last = 0.0

    def __call__(self, nbytes: int) -> None:
        self.done += nbytes
        now = time.monotonic()
        if self.enabled and (now - self._last > 0.2 or self.done >= self.total):
            self._last = now
            rate = self.done / max(now - self._start, 1e-6)
            pct = 100.0 * self.done / self.total if self.total else 100.0
            self.stream.write(
                f"\r{self.label}: {pct:5.1f}% {format_size(self.done)} / {format_size(self.total)} ({format_size(rate)}/s)"
            )
            self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\n")
