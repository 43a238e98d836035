"""``shardfeed inspect DATASET --hot``: the hot index's coverage curve and the cache plan."""

from __future__ import annotations

import argparse

from shardfeed.cli._common import EXIT_OK, print_json
from shardfeed.cli.table import format_table
from shardfeed.schemas.units import format_size

_SHARES = (0.5, 0.8, 0.9, 0.99)


def run(args: argparse.Namespace) -> int:
    from shardfeed.formats.errors import HotIndexMissingError
    from shardfeed.formats.reader import open_dataset
    from shardfeed.hot import load_cache_plan, load_hot_index

    with open_dataset(args.dataset) as ds:
        hot = load_hot_index(ds)
        try:
            plan = load_cache_plan(ds).header.to_json()
        except HotIndexMissingError:
            plan = None
        curve = hot.curve()
        needed = {f"{share:.0%}": hot.bytes_for_share(share) for share in _SHARES}
        if args.plot:
            from shardfeed.plots import plot_hot_cdf

            plot_hot_cdf(hot, args.plot)
    h = hot.header
    if args.json:
        print_json(
            {
                "hot": {
                    "header": h.to_json(),
                    "curve": curve,
                    "cache_bytes_for_share": needed,
                    "cache_plan": plan,
                }
            }
        )
        return EXIT_OK
    lines = [
        f"hot index      {h.samples:,} samples ({h.source.kind}: {h.source.detail})",
        f"per epoch      {h.expected_accesses:,.0f} expected accesses, {format_size(h.accessed_bytes)}",
        "",
        *format_table(
            ("cache", "bytes", "of bytes", "of accesses"),
            [
                (
                    f"{p['fraction_of_dataset']:.0%}",
                    format_size(p["cache_bytes"]),
                    f"{p['bytes_share']:.1%}",
                    f"{p['accesses_share']:.1%}",
                )
                for p in curve
            ],
            ">>>>",
        ),
    ]
    lines.append("")
    lines += [f"cache for {k:>3} of accessed bytes: {format_size(v)}" for k, v in needed.items()]
    if plan:
        lines += [
            "",
            f"cache plan     {plan['nodes']} node(s), {format_size(plan['node_budget'])} each",
        ]
        lines += [
            f"  node {p['node']}: {p['samples']:,} samples, {format_size(p['bytes'])}, "
            f"serves {p['coverage']:.1%}"
            for p in plan["pins"]
        ]
    print("\n".join(lines))
    return EXIT_OK
