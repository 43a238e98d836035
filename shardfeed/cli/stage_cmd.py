"""``shardfeed stage DATASET --tiers tiers.toml``: copy a dataset to its shared tiers."""

from __future__ import annotations

import argparse

from shardfeed import BEAM_INSTALL_HINT
from shardfeed.cli._common import (
    EXIT_OK,
    add_break_lease,
    add_progress_flags,
    fail,
    print_json,
    progress_setting,
)
from shardfeed.cli.table import Note, format_table
from shardfeed.progress import Progress
from shardfeed.schemas.units import format_size


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "stage",
        help="copy the dataset to its shared tiers (verified, resumable), and record the copies",
        description=(
            "Copy the dataset to the shared tiers of the tier config's policy: tiers in 'all' get "
            "every file and the manifest (a complete dataset), tiers only in 'hot' get the hot "
            "shards. Each file goes to a temporary name, is hashed while copying and fsynced, "
            "checked against the manifest's sha256, then renamed. A re-run skips verified copies "
            "and re-copies corrupt ones. Refuses before copying if a capacity would be exceeded. "
            "Records the copies in meta/shardfeed/locations.json. See docs/STAGING.md."
        ),
    )
    parser.add_argument("dataset", help="dataset directory or URI")
    parser.add_argument("--tiers", required=True, metavar="TIERS.toml", help="the tier config")
    parser.add_argument(
        "--dry-run", action="store_true", help="print the plan (files, bytes, time) and stop"
    )
    parser.add_argument("--workers", type=int, default=4, help="parallel copy streams (default 4)")
    parser.add_argument(
        "--tier",
        action="append",
        metavar="NAME",
        help="stage only this tier (repeatable); default: every shared tier of the policy",
    )
    parser.add_argument("--json", action="store_true", help="print the plan and result as JSON")
    parser.add_argument(
        "--runner",
        help="run the copies as a Beam pipeline on this runner (e.g. dask; needs "
        "shardfeed[beam]); other Beam flags pass through. Default: a local thread pool",
    )
    add_progress_flags(parser)
    add_break_lease(parser, "the tier copy's")
    parser.set_defaults(run=run, accepts_extra=True)


def run(args: argparse.Namespace, beam_args: list[str]) -> int:
    from shardfeed.staging import plan, stage

    if beam_args and not args.runner:
        return fail(f"unrecognized arguments: {' '.join(beam_args)} (Beam flags need --runner)", 2)
    if args.runner:
        try:
            import shardfeed.pipelines  # noqa: F401
        except ImportError:
            return fail(BEAM_INSTALL_HINT)
        beam_args = [f"--runner={args.runner}", *beam_args]

    only = tuple(args.tier) if args.tier else None
    planned = plan(args.dataset, args.tiers, only=only)
    staging = planned[2]
    total = sum(t.bytes for t in staging.tiers)
    # a Beam runner's copies report nothing here
    enabled = False if args.dry_run or args.runner else progress_setting(args)
    with Progress(total, "stage", enabled=enabled) as bar:  # copy threads report to it
        report = stage(
            args.dataset,
            args.tiers,
            dry_run=args.dry_run,
            workers=args.workers,
            only=only,
            progress=bar,
            beam_args=beam_args if args.runner else None,
            planned=planned,
        )
    if args.json:
        print_json(report.to_json())
        return EXIT_OK
    rows: list[tuple[str, ...] | Note] = []
    for t in report.plan.tiers:
        rows.append(
            (
                t.tier,
                f"{len(t.tasks):,}",
                format_size(t.bytes),
                format_size(t.capacity),
                f"{t.seconds:.1f}s",
                f"{t.uri}{'  (complete)' if t.complete else '  (hot shards)'}",
            )
        )
        rows.append(Note(report.striping.get(t.tier, ""), column=1))
    headers = ("tier", "files", "bytes", "capacity", "est. time", "copy")
    print("\n".join(format_table(headers, rows, "<>>>><", indent="")))
    for note in report.plan.notes:
        print(f"note: {note}")
    if args.dry_run:
        print("dry run: nothing was copied")
        return EXIT_OK
    for r in report.results:
        rate = r.bytes_copied / r.seconds if r.seconds else 0
        print(
            f"{r.tier}: copied {r.copied}, re-copied {r.recopied} corrupt, skipped {r.skipped} verified; "
            f"{format_size(r.bytes_copied)} in {r.seconds:.1f} s ({format_size(rate)}/s)"
            + (
                f"; removed {r.removed_temporaries} leftover temporary file(s)"
                if r.removed_temporaries
                else ""
            )
        )
    print("recorded the copies in meta/shardfeed/locations.json")
    return EXIT_OK
