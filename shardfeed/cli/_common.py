"""Shared CLI plumbing: clean error reporting, JSON output and the progress flags."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, TextIO

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
EXIT_INTERRUPTED = 130  # Ctrl-C: 128 + SIGINT, as shells report it


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


def add_progress_flags(parser: argparse.ArgumentParser, *, force: bool = False) -> None:
    """``--no-progress`` (and ``--progress`` with ``force``) for a long command. The line is
    drawn on stderr by default only when it is a terminal; ``--json`` always turns it off."""
    if force:
        parser.add_argument(
            "--progress",
            dest="progress",
            action="store_const",
            const=True,
            help="always show the progress line (by default only when stderr is a terminal)",
        )
    parser.add_argument(
        "--no-progress",
        dest="progress",
        action="store_const",
        const=False,
        help="never show the progress line (rate, done/total, ETA) on stderr",
    )
    parser.set_defaults(progress=None)


def progress_setting(args: argparse.Namespace) -> bool | None:
    """The ``enabled`` setting for ``shardfeed.progress``: False with ``--json`` or
    ``--no-progress``, True with ``--progress``, None (stderr is a terminal) otherwise."""
    if getattr(args, "json", False):
        return False
    return getattr(args, "progress", None)
