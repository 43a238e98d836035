"""``shardfeed unstage DATASET --tiers tiers.toml [--tier NAME]``: remove staged copies."""

from __future__ import annotations

import argparse

from shardfeed.cli._common import (
    EXIT_FAILED,
    EXIT_OK,
    add_break_lease,
    add_progress_flags,
    print_json,
    progress_setting,
)
from shardfeed.progress import Progress


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "unstage",
        help="remove what stage (or warm, on this node) put on a tier, and only that",
        description=(
            "Delete the copies locations.json records for the tier (or, for a node tier, those "
            "shardfeed warm created on this node) while their bytes are still the ones staged, "
            "remove directories left empty, and update locations.json. Files staging did not "
            "write, or that changed since, are never touched."
        ),
    )
    parser.add_argument("dataset", help="the source dataset directory (holds locations.json)")
    parser.add_argument("--tiers", required=True, metavar="TIERS.toml", help="the tier config")
    parser.add_argument(
        "--tier", action="append", metavar="NAME", help="only this tier (repeatable)"
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    add_progress_flags(parser)
    add_break_lease(parser, "the tier copy's")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from shardfeed.unstaging import unstage

    only = tuple(args.tier) if args.tier else None
    with Progress(None, "unstage", enabled=progress_setting(args)) as bar:  # bytes checked
        reports = unstage(args.dataset, args.tiers, only=only, progress=bar)
    if args.json:
        print_json([r.to_json() for r in reports])
    else:
        for r in reports:
            print(f"{r.tier}: removed {r.removed} file(s) from {r.root}")
            for rel in r.kept:
                print(f"  kept {rel}: changed since it was staged, so not shardfeed's to delete")
    return EXIT_FAILED if any(r.kept for r in reports) else EXIT_OK
