"""``shardfeed verify DATASET``: recheck every file against the manifest; exit 1 on any problem."""

from __future__ import annotations

import argparse
import sys

from shardfeed.cli._common import (
    EXIT_FAILED,
    EXIT_OK,
    add_progress_flags,
    print_json,
    progress_setting,
)
from shardfeed.formats.reader import load_manifest
from shardfeed.formats.storage import locate
from shardfeed.formats.verify import verify_location
from shardfeed.progress import Progress
from shardfeed.schemas.units import format_size


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "verify",
        help="check every shard and metadata file against the manifest (sha256, size, rows, extras)",
        description=(
            "Recompute sha256 and sizes of every file the manifest lists, check shard row counts, and "
            "flag unlisted files under data/ and videos/ and temporary leftovers anywhere. Exit 0 when all match, 1 otherwise."
        ),
    )
    parser.add_argument("dataset", help="dataset directory or URI")
    parser.add_argument(
        "--no-hash",
        action="store_true",
        help="skip sha256 (sizes, rows and extras only; much faster)",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    add_progress_flags(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    location = locate(args.dataset)
    manifest = load_manifest(location)
    total = sum(s.bytes for s in manifest.shards)
    with Progress(total, "verify", enabled=progress_setting(args)) as progress:
        report = verify_location(
            location, manifest, check_hashes=not args.no_hash, progress=progress
        )
    if args.json:
        print_json(report.to_json())
    elif report.ok:
        print(
            f"OK: {report.shards_checked} shards and {report.files_checked} files match the manifest ({format_size(report.bytes_hashed)} hashed"
            + (f"; {report.io_retries} object-store retries" if report.io_retries else "")
            + ")"
        )
    else:
        for problem in report.problems:  # BAD: bytes that arrived wrong; IO: never arrived
            print(f"{'IO ' if problem.kind == 'io' else 'BAD'} {problem}", file=sys.stderr)
        print(f"FAILED: {len(report.problems)} problem(s) in {args.dataset}", file=sys.stderr)
    return EXIT_OK if report.ok else EXIT_FAILED
