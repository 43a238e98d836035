"""``shardfeed inspect DATASET``: what a dataset holds and how well it is balanced."""

from __future__ import annotations

import argparse

from shardfeed.cli import assignment_view, hot_view
from shardfeed.cli._common import EXIT_OK, fail, print_json
from shardfeed.cli.table import format_table
from shardfeed.formats.reader import load_locations, open_dataset
from shardfeed.schemas.units import format_size
from shardfeed.summary import dataset_summary, staging_summary


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "inspect",
        help="summarise a dataset: samples, shards, sizes, balance, features, rejects",
        description="Summarise a published dataset from its manifest and meta/info.json (no shard is read).",
    )
    parser.add_argument("dataset", help="dataset directory or URI (e.g. s3://bucket/ds)")
    parser.add_argument(
        "--json", action="store_true", help="print the summary, the shard list and balance as JSON"
    )
    parser.add_argument(
        "--shards",
        type=int,
        default=10,
        metavar="N",
        help="list the first N shards in the table (default 10; 0 for none, -1 for all)",
    )
    view = parser.add_argument_group("assignment view")
    view.add_argument(
        "--assignment",
        metavar="NAME",
        help="show assignment NAME instead: per-rank samples, bytes, spans and node-affinity share",
    )
    view.add_argument("--epoch", type=int, default=0, help="epoch to show (default 0)")
    view.add_argument("--rank", type=int, help="show only this rank, with its spans")
    view.add_argument(
        "--plot",
        metavar="OUT.png",
        help="also draw per-rank bytes and per-node shard sets (needs shardfeed[plot])",
    )
    parser.add_argument(
        "--hot",
        action="store_true",
        help="show the hot index instead: the coverage curve (share of expected accesses "
        "served against cache bytes); with --plot, the hot-set CDF",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.hot and args.assignment:
        return fail("--hot and --assignment are separate views; pick one", 2)
    if args.hot:
        return hot_view.run(args)
    if args.assignment:
        return assignment_view.run(args)
    if args.plot or args.rank is not None:
        return fail("--plot and --rank belong to the --assignment (or --hot) view", 2)
    with open_dataset(args.dataset, use_locations=False) as ds:  # no shard is read
        summary = dataset_summary(ds.manifest, ds.info)
        locations = load_locations(ds.location, ds.manifest)
        staged = staging_summary(ds.manifest, locations) if locations is not None else None
        if args.json:
            summary["shards"] = [s.to_json() for s in ds.manifest.shards]
            if staged is not None:
                summary["tiers"] = staged["tiers"]
                for item, copies in zip(summary["shards"], staged["copies"], strict=True):
                    item["copies"] = copies
            print_json(summary)
            return EXIT_OK
        print(render(args.dataset, summary, ds.manifest.shards, args.shards, staged))
    return EXIT_OK


def render(name: str, s: dict, shards, limit: int, staged: dict | None = None) -> str:
    """The text view; ``staged`` (from ``staging_summary``) adds the tiers and each shard's
    copies."""
    bal = s["balance"]
    lines = [
        f"dataset        {name}",
        f"samples        {s['num_samples']:,}",
        f"shards         {s['num_shards']:,} ({s['num_row_groups']:,} row groups, {s['encoding']})",
        f"bytes          {format_size(s['bytes'])} on disk, {format_size(s['payload_bytes'])} payload",
        f"compression    {s['compression_ratio']}x (payload / on disk)"
        if s["compression_ratio"]
        else "compression    n/a",
        f"shard bytes    min {format_size(s['shard_bytes']['min'])}  mean {format_size(s['shard_bytes']['mean'])}  max {format_size(s['shard_bytes']['max'])}",
        f"balance        bytes max/mean {bal['bytes_max_over_mean']:.4f}   payload max/mean {bal['payload_bytes_max_over_mean']:.4f}"
        + (
            f"   ({bal['oversized_unit_shards']} shard(s) holding one unit larger than the target left out)"
            if bal["oversized_unit_shards"]
            else ""
        ),
        f"episodes       {s['episodes']:,}   tasks {s['tasks']:,}   fps {s['fps']}",
        f"rejects        {s['rejects']['total']:,}",
        *format_table(
            None,
            [(reason, f"{count:,}") for reason, count in s["rejects"]["by_reason"].items()],
            "<>",
        ),
        *(
            [f"duplicates     {s['duplicates']['total']:,} (left out by convert --dedup)"]
            if "duplicates" in s
            else []
        ),
        f"fingerprint    {s['fingerprint']}",
        f"source         {s['provenance']['source'] or '-'} (shardfeed {s['provenance']['shardfeed_version']})",
        "",
        "features",
    ]
    lines += format_table(
        None,
        [
            (
                fname,
                feat["dtype"],
                feat["shape"],
                "" if feat["stored"] else "(in videos/, no data column)",
            )
            for fname, feat in s["features"].items()
        ],
        "<<<<",
    )
    if s.get("splits"):
        lines += ["", "splits (info.json range; shards [first, end); bytes max/mean)"]
        split_rows = [
            (
                split_name,
                f"rows [{sp['index_start']}, {sp['index_end']})",
                f"{sp['rows']:,}",
                f"info {sp['info_range']}",
                f"shards [{sp['shards'][0]}, {sp['shards'][1]})",
                format_size(sp["bytes"]),
                f"balance {sp['bytes_max_over_mean']:.4f}",
            )
            for split_name, sp in s["splits"].items()
        ]
        lines += format_table(None, split_rows, "<<><<><")
    if staged is not None:
        lines += _render_tiers(staged["tiers"])
    shown = shards if limit < 0 else shards[:limit]
    if shown:
        lines += [
            "",
            f"shards (first {len(shown)} of {len(shards)})"
            if len(shown) < len(shards)
            else "shards",
        ]
        headers = ["path", "rows", "groups", "bytes", "payload", "index range"]
        rows = [
            [
                rec.path,
                f"{rec.rows:,}",
                f"{len(rec.row_groups)}",
                format_size(rec.bytes),
                format_size(rec.payload_bytes),
                f"[{rec.index_start}, {rec.index_end})",
            ]
            for rec in shown
        ]
        if staged is not None:
            headers.append("copies")
            for row, held in zip(rows, staged["copies"][: len(rows)], strict=True):
                row.append(",".join(held) or "-")
        lines += format_table(headers, rows, "<>>>><<"[: len(headers)])
    return "\n".join(lines)


def _render_tiers(tiers: dict) -> list[str]:
    """The tiers section: one line per tier, in the order readers try them."""
    rows = []
    for name, t in tiers.items():
        node = t["shards"] is None
        rows.append(
            (
                name,
                t["scope"],
                "yes" if t["complete"] else "no",
                "-" if node else f"{t['shards']:,}",
                "-" if node else format_size(t["bytes"]),
                t["uri"] + ("  (per node, see shardfeed warm)" if node else ""),
            )
        )
    return [
        "",
        "tiers (staged copies, in the order readers try them; then the dataset itself)",
        *format_table(("name", "scope", "complete", "shards", "bytes", "uri"), rows, "<<<>><"),
    ]
