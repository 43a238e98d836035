"""The ``shardfeed`` command: a thin parser over library functions, one module per subcommand."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

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
from shardfeed.cli._common import EXIT_FAILED, fail
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
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in COMMANDS:
        command.add_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if not getattr(args, "run", None):
        parser.print_help()
        return 2
    if extra and not getattr(args, "accepts_extra", False):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        return args.run(args, extra) if getattr(args, "accepts_extra", False) else args.run(args)
    except (ShardfeedError, ValueError) as err:  # bad input or arguments: a message, no traceback
        return fail(str(err))
    except BrokenPipeError:  # e.g. `shardfeed inspect ds | head`; before OSError, its base
        return EXIT_FAILED
    except (OSError, KeyError, pa.ArrowException) as err:
        return fail(f"{type(err).__name__}: {err}")
    except KeyboardInterrupt:
        return fail("interrupted", 130)


if __name__ == "__main__":
    sys.exit(main())
