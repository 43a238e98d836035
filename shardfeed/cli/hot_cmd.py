"""``shardfeed hot DATASET``: the hot-sample index and the per-node cache plan."""

from __future__ import annotations

import argparse

from shardfeed.cli._common import EXIT_OK, add_break_lease, print_json
from shardfeed.schemas.units import format_size


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "hot",
        help="rank samples by expected accesses and plan what each node caches",
        description=(
            "Write meta/shardfeed/hot_index.parquet (samples by expected accesses per epoch) and "
            "meta/shardfeed/cache_plan.parquet (the rows each node pins within its budget). "
            "Expected accesses come from sampling weights (with replacement, as many draws per "
            "epoch as samples) or from an access log of an earlier run. See docs/HOT.md."
        ),
    )
    parser.add_argument(
        "dataset", help="dataset directory or object-store URI (the files are written into it)"
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--weights",
        metavar="SPEC",
        help="column:NAME (a numeric column), SRC=W,SRC=W (a mixture over --source-column), or a "
        "file of 'index,weight' lines or Parquet columns index, weight",
    )
    source.add_argument(
        "--access-log",
        metavar="FILE",
        help="accessed global sample indices: one per line, or Parquet with an 'index' column",
    )
    parser.add_argument(
        "--source-column",
        default="source",
        help="string column a mixture refers to (default source)",
    )
    parser.add_argument(
        "--draws-per-epoch",
        type=int,
        help="samples drawn per epoch with weights (default: the number of samples)",
    )
    parser.add_argument(
        "--log-epochs",
        type=float,
        default=1.0,
        help="epochs the access log covers (default 1)",
    )
    parser.add_argument(
        "--node-budget",
        default="10%",
        help="cache per node: a share of the dataset's payload (10%%) or a size (2TB); default 10%%",
    )
    parser.add_argument(
        "--assignment",
        metavar="NAME",
        help="plan each node's cache from the samples this assignment gives it",
    )
    parser.add_argument(
        "--nodes", type=int, default=1, help="nodes, without --assignment (default 1)"
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    add_break_lease(parser, "the dataset's")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from shardfeed.assignment import load_assignment
    from shardfeed.formats.reader import open_dataset
    from shardfeed.hot import build_hot_index, plan_cache

    with open_dataset(args.dataset) as ds:
        hot = build_hot_index(
            ds,
            weights=args.weights,
            access_log=args.access_log,
            source_column=args.source_column,
            draws_per_epoch=args.draws_per_epoch,
            log_epochs=args.log_epochs,
        ).save()
        assignment = load_assignment(ds, args.assignment) if args.assignment else None
        plan = plan_cache(hot, args.node_budget, assignment=assignment, nodes=args.nodes).save()
    h, p = hot.header, plan.header
    if args.json:
        print_json(
            {
                "hot_index": h.to_json(),
                "curve": hot.curve(),
                "cache_plan": p.to_json(),
            }
        )
        return EXIT_OK
    print(
        f"hot index: {h.samples:,} samples with expected accesses ({h.source.kind}: {h.source.detail}); "
        f"{h.expected_accesses:,.0f} accesses and {format_size(h.accessed_bytes)} expected per epoch"
    )
    for point in hot.curve():
        print(
            f"  cache {point['fraction_of_dataset']:>5.0%} of the dataset ({format_size(point['cache_bytes'])}): "
            f"serves {point['bytes_share']:.1%} of accessed bytes, {point['accesses_share']:.1%} of accesses"
        )
    print(
        f"cache plan: {p.nodes} node(s), {format_size(p.node_budget)} each ({p.budget_spec})"
        + (f", from assignment {p.assignment}" if p.assignment else "")
    )
    for pin in p.pins:
        print(
            f"  node {pin.node}: pins {pin.samples:,} samples, {format_size(pin.bytes)} in "
            f"{pin.spans:,} spans ({pin.whole_shards} whole shards), serving {pin.coverage:.1%} "
            "of its expected accessed bytes"
        )
    print(
        "wrote meta/shardfeed/hot_index.{parquet,json} and meta/shardfeed/cache_plan.{parquet,json}"
    )
    return EXIT_OK
