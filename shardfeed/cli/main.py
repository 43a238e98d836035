"""The ``shardfeed`` command: a thin parser over library functions, one module per subcommand."""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import sys
from collections.abc import Iterator, Sequence

import pyarrow as pa

from shardfeed import __version__
from shardfeed.cli import (
    assign_cmd,
    convert_cmd,
    hot_cmd,
    inspect_cmd,
    plan_cmd,
    rejects_cmd,
    stage_cmd,
    unstage_cmd,
    verify_cmd,
    warm_cmd,
)
from shardfeed.cli._common import EXIT_FAILED, EXIT_INTERRUPTED, fail
from shardfeed.formats import retry, writer_lease
from shardfeed.schemas.errors import ShardfeedError

COMMANDS = (
    convert_cmd,
    inspect_cmd,
    verify_cmd,
    rejects_cmd,
    assign_cmd,
    hot_cmd,
    plan_cmd,
    stage_cmd,
    warm_cmd,
    unstage_cmd,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="shardfeed",
        description="Offline dataset sharding for GPU training: inspect and verify size-balanced, checksummed shards.",
    )
    parser.add_argument("--version", action="version", version=f"shardfeed {__version__}")
    io = parser.add_argument_group(
        "object-store retries (before COMMAND; each also an environment variable, which worker "
        "processes on other machines must be given themselves; see docs/RELIABILITY.md)"
    )
    io.add_argument(
        "--io-attempts",
        metavar="N",
        help=f"attempts per object-store call, the first included ({retry.ATTEMPTS_ENV}, 10)",
    )
    io.add_argument(
        "--io-retry-seconds",
        metavar="S",
        help=f"total time one call may take with its waits ({retry.SECONDS_ENV}, 120)",
    )
    io.add_argument(
        "--io-timeout",
        metavar="S",
        help=f"connect and request timeout of one request ({retry.TIMEOUT_ENV}, 60)",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in COMMANDS:
        command.add_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None, own_process: bool = False) -> int:
    """Run one ``shardfeed`` command; its exit code. ``own_process``: this process runs nothing
    else (the command itself, :func:`entry`), so it may leave unused libraries out."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    args.own_process = own_process
    if not getattr(args, "run", None):
        parser.print_help()
        return 2
    if extra and not getattr(args, "accepts_extra", False):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        with _io_settings(args):
            if getattr(args, "accepts_extra", False):
                return args.run(args, extra)
            return args.run(args)
    except (ShardfeedError, ValueError) as err:  # bad input or arguments: a message, no traceback
        return fail(str(err))
    except BrokenPipeError:  # e.g. `shardfeed inspect ds | head`; before OSError, its base
        return EXIT_FAILED
    except (OSError, KeyError, pa.ArrowException) as err:
        return fail(f"{type(err).__name__}: {err}")
    except KeyboardInterrupt:
        return fail("interrupted", EXIT_INTERRUPTED)


@contextlib.contextmanager
def _io_settings(args: argparse.Namespace) -> Iterator[None]:
    """The retry flags and ``--break-lease``, set as their environment variables for the
    command (and the worker processes it starts), checked first; the environment is restored
    afterwards."""
    given = {
        retry.ATTEMPTS_ENV: args.io_attempts,
        retry.SECONDS_ENV: args.io_retry_seconds,
        retry.TIMEOUT_ENV: args.io_timeout,
    }
    if getattr(args, "break_lease", False):
        given[writer_lease.BREAK_ENV] = "1"
    given = {name: value for name, value in given.items() if value is not None}
    before = {name: os.environ.get(name) for name in given}
    os.environ.update(given)
    try:
        retry.RetryPolicy.from_env()  # a bad value is one line before any work
        retry.io_timeout()
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def entry() -> None:
    """The ``shardfeed`` command: :func:`main`, then exit with its code, skipping the cycle
    collector's last pass at interpreter exit. Beam's and Arrow's modules leave a large object
    graph, and that pass over it took about 0.35 s of every command that imported Beam.
    Everything a command writes is closed and synced before it returns; modules are still torn
    down, standard streams flushed and ``atexit`` handlers run as usual."""
    code = main(own_process=True)
    gc.disable()
    gc.freeze()
    sys.exit(code)


if __name__ == "__main__":
    entry()
