"""``shardfeed assign DATASET``: plan and store what every rank reads, per epoch."""

from __future__ import annotations

import argparse
import time

from shardfeed.cli._common import (
    EXIT_OK,
    EXIT_USAGE,
    add_break_lease,
    add_progress_flags,
    fail,
    print_json,
    progress_setting,
)
from shardfeed.cli.table import format_table
from shardfeed.progress import Progress


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "assign",
        help="plan per-rank reads (equal samples, balanced bytes, node-local) into the dataset",
        description=(
            "Plan which rows every (epoch, rank, worker) reads and store the plan as "
            "meta/shardfeed/assignments/NAME.parquet plus NAME.json. Every rank gets the same "
            "number of samples and near-equal bytes; each node reads mostly from its own set of "
            "shards, the same every epoch; order is reshuffled per epoch. With --resume-from, "
            "plan the rest of an epoch of an earlier assignment for this (new) world instead. "
            "See docs/ASSIGNMENT.md."
        ),
    )
    parser.add_argument(
        "dataset", help="dataset directory or object-store URI (the plan is written into it)"
    )
    parser.add_argument("--nodes", type=int, required=True, help="nodes in the job")
    parser.add_argument("--gpus-per-node", type=int, required=True, help="ranks per node")
    parser.add_argument(
        "--workers", type=int, default=1, help="loader workers per rank (default 1)"
    )
    parser.add_argument("--epochs", type=int, default=1, help="epochs to plan (default 1)")
    parser.add_argument("--seed", type=int, default=0, help="shuffle seed (default 0)")
    parser.add_argument(
        "--batch-size",
        type=int,
        default=None,
        help="per-rank batch size: each rank's count becomes whole batches, and workers "
        "get whole batches (default: none, i.e. 1)",
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument(
        "--drop-last",
        dest="mode",
        action="store_const",
        const="drop",
        help="leave out the few samples that do not divide evenly (counted)",
    )
    mode.add_argument(
        "--pad",
        dest="mode",
        action="store_const",
        const="pad",
        help="repeat a few samples so every sample is read (counted; the default)",
    )
    parser.set_defaults(mode="pad")
    parser.add_argument(
        "--block-rows",
        type=int,
        default=None,
        help="rows per shuffle block, the unit each rank reads contiguously: larger reads "
        "faster, smaller shuffles better (capped so every rank gets at least 64 blocks). "
        "Default: the dataset's row groups, each dealt whole to one rank, so ranks rarely "
        "decode the same group (equal-row blocks of about 4 MiB where that would unbalance "
        "bytes, or the layout is not known)",
    )
    parser.add_argument(
        "--split",
        metavar="NAME",
        help="plan only the shards of this named split (datasets made with convert --split)",
    )
    parser.add_argument("--name", required=True, help="assignment name (A-Z a-z 0-9 . _ -)")
    parser.add_argument(
        "--overwrite", action="store_true", help="replace an assignment of the same name"
    )
    resume = parser.add_argument_group("elastic resume")
    resume.add_argument(
        "--resume-from", metavar="NAME", help="assignment whose epoch was interrupted"
    )
    resume.add_argument(
        "--resume-epoch", type=int, metavar="E", help="the interrupted epoch (with --resume-from)"
    )
    resume.add_argument(
        "--samples-seen",
        type=int,
        metavar="N",
        help="samples consumed in that epoch over all ranks of the old world (with --resume-from)",
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    add_progress_flags(parser)
    add_break_lease(parser, "the dataset's")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from shardfeed.assignment import World, load_assignment, plan_assignment, resume

    world = World(args.nodes, args.gpus_per_node, args.workers)
    started = time.monotonic()
    if args.resume_from:
        if args.resume_epoch is None or args.samples_seen is None:
            return fail("--resume-from needs --resume-epoch and --samples-seen", EXIT_USAGE)
        if args.split is not None:
            return fail("--split does not apply to --resume-from (it keeps its split)", EXIT_USAGE)
        origin = load_assignment(args.dataset, args.resume_from)
        planned = resume(origin, args.resume_epoch, args.samples_seen, world, name=args.name)
    else:
        with Progress(args.epochs, "assign", noun="epochs", enabled=progress_setting(args)) as bar:
            planned = plan_assignment(
                args.dataset,
                world,
                epochs=args.epochs,
                seed=args.seed,
                mode=args.mode,
                batch_size=args.batch_size,
                block_rows=args.block_rows,
                name=args.name,
                progress=lambda _epoch: bar(1),
                split=args.split,
            )
    planned.save(overwrite=args.overwrite)
    seconds = round(time.monotonic() - started, 3)
    reports = [planned.report(e) for e in planned.epochs]
    if args.json:
        print_json(
            {
                "header": planned.header.to_json(),
                "epochs": [_brief(r) for r in reports],
                "seconds": seconds,
            }
        )
        return EXIT_OK
    h = planned.header
    print(
        f"assignment {h.name}: {h.world.nodes} nodes x {h.world.gpus_per_node} GPUs x "
        f"{h.world.workers} workers, mode {h.policy.mode}, seed {h.seed}"
        + (f", split {h.split}" if h.split is not None else "")
        + (
            f", resumed from {h.resumed_from.name} epoch {h.resumed_from.epoch}"
            if h.resumed_from
            else ""
        )
    )
    rows = []
    for r in reports:
        b = _brief(r)
        runs = b.get("row_group_runs_per_group")
        rows.append(
            (
                b["epoch"],
                f"{b['samples_per_rank']:,}",
                f"{b['dropped']:,}",
                f"{b['padded']:,}",
                f"{b['spans']:,}",
                f"{b['bytes_max_over_mean']:.4f}",
                f"{b['home_share_min']:.4f}",
                "-" if runs is None else f"{runs:.2f}",
            )
        )
    headers = (
        "epoch",
        "samples/rank",
        "dropped",
        "padded",
        "spans",
        "bytes max/mean",
        "home share min",
        "runs/group",
    )
    print("\n".join(format_table(headers, rows, ">" * len(headers))))
    note = _shared_groups_note(reports)
    if note:
        print(note)
    print(
        f"  wrote meta/shardfeed/assignments/{h.name}.parquet ({h.table.bytes:,} bytes) and {h.name}.json in {seconds} s"
    )
    return EXIT_OK


#: above this many runs per row group, the output says why and what lowers it
_SHARED_GROUPS_NOTE = 1.5


def _shared_groups_note(reports: list[dict]) -> str | None:
    """A note when loaders will decode row groups several times over: a rank's share, or the
    unit it is dealt in, is small next to the dataset's row groups, so ranks share groups."""
    worst = max(reports, key=lambda r: r.get("row_group_runs", {}).get("runs_per_group", 0))
    runs = worst.get("row_group_runs")
    if runs is None or runs["runs_per_group"] <= _SHARED_GROUPS_NOTE:
        return None
    return (
        f"  note: loaders will decode up to {runs['runs_per_group']:.2f}x the row groups they "
        f"touch: ranks share row groups ({worst['samples_per_rank']:,} samples per rank, dealt "
        f"in units of about {worst['block_rows']:,} rows; row groups of about "
        f"{runs['mean_group_rows']:,.0f}). More samples per rank, --block-rows left at its "
        f"default, or shards converted with a smaller --row-group-size bring it down "
        f"(docs/ASSIGNMENT.md)."
    )


def _brief(report: dict) -> dict:
    runs = report.get("row_group_runs")
    return {
        **({"row_group_runs_per_group": runs["runs_per_group"]} if runs else {}),
        "epoch": report["epoch"],
        "samples_per_rank": report["samples_per_rank"],
        "dropped": report["dropped"],
        "padded": report["padded"],
        "spans": sum(r["spans"] for r in report["ranks"]),
        "samples_equal": report["samples_equal"],
        "bytes_max_over_mean": report["bytes_max_over_mean"],
        "home_share_min": report["summary"]["home_share"]["min"],
    }
