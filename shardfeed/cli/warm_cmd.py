"""``shardfeed warm DATASET --tiers tiers.toml --node-rank R --nodes N``: fill a node's NVMe."""

from __future__ import annotations

import argparse

from shardfeed.cli._common import (
    EXIT_OK,
    add_break_lease,
    add_progress_flags,
    print_json,
    progress_setting,
)
from shardfeed.progress import Progress
from shardfeed.schemas.units import format_size


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "warm",
        help="copy this node's hot and assigned shards to its node-local tier (run per node)",
        description=(
            "Run once per node, e.g. srun --ntasks-per-node=1 shardfeed warm DATASET --tiers "
            "tiers.toml --node-rank $SLURM_NODEID --nodes $SLURM_NNODES --assignment NAME. "
            "Copies the hot shards, then the shards this node's assignment reads (home shards "
            "first), while the node tier's capacity lasts, from the nearest shared copy; each "
            "file verified by sha256 and renamed into place. Never deletes files it did not "
            "create. See docs/STAGING.md."
        ),
    )
    parser.add_argument("dataset", help="dataset directory or URI (its staged copy is fine)")
    parser.add_argument("--tiers", required=True, metavar="TIERS.toml", help="the tier config")
    parser.add_argument("--node-rank", type=int, required=True, help="this node, 0..N-1")
    parser.add_argument("--nodes", type=int, required=True, help="nodes in the job")
    parser.add_argument(
        "--assignment", metavar="NAME", help="also copy the shards it gives this node"
    )
    parser.add_argument("--workers", type=int, default=4, help="parallel copy streams (default 4)")
    parser.add_argument("--dry-run", action="store_true", help="list the shards and stop")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    add_progress_flags(parser)
    add_break_lease(parser, "the node tier copy's")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from shardfeed.warming import warm

    enabled = False if args.dry_run else progress_setting(args)
    with Progress(None, "warm", enabled=enabled) as bar:  # warm tells it the total
        report = warm(
            args.dataset,
            args.tiers,
            node_rank=args.node_rank,
            nodes=args.nodes,
            assignment=args.assignment,
            workers=args.workers,
            dry_run=args.dry_run,
            progress=bar,
        )
    if args.json:
        print_json(report.to_json())
        return EXIT_OK
    print(
        f"node {report.node}: {len(report.planned)} shard(s) for tier {report.tier} at {report.root} "
        f"(capacity {format_size(report.capacity)}), from {report.source}"
        + (f"; {report.left_out} left out over capacity" if report.left_out else "")
    )
    if args.dry_run:
        print("\n".join(f"  {p}" for p in report.planned) or "  (none)")
        print("dry run: nothing was copied")
        return EXIT_OK
    print(
        f"copied {report.copied}, skipped {report.skipped} verified; the node holds "
        f"{format_size(report.bytes)} of this dataset ({report.seconds:.1f} s)"
    )
    return EXIT_OK
