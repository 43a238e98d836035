"""``shardfeed inspect DATASET --assignment NAME``: per-rank samples, bytes, spans and affinity."""

from __future__ import annotations

import argparse

from shardfeed.cli._common import EXIT_OK, EXIT_USAGE, fail, print_json
from shardfeed.cli.table import format_table
from shardfeed.schemas.units import format_size

_SPANS_SHOWN = 20  # spans listed per worker with --rank (all of them with --json)


def run(args: argparse.Namespace) -> int:
    from shardfeed.assignment import load_assignment
    from shardfeed.formats.reader import open_dataset

    with open_dataset(args.dataset) as ds:
        assignment = load_assignment(ds, args.assignment)
        report = assignment.report(args.epoch)
        world = assignment.world
        if args.rank is not None and not 0 <= args.rank < world.ranks:
            return fail(
                f"--rank {args.rank} is outside the world's {world.ranks} ranks", EXIT_USAGE
            )
        if args.plot:
            from shardfeed.plots import plot_assignment

            plan = assignment.epoch_plan(args.epoch)
            plot_assignment(report, plan, assignment.span_bytes(plan.spans), args.plot)
        shown = report["ranks"] if args.rank is None else [report["ranks"][args.rank]]
        spans = [] if args.rank is None else _rank_spans(assignment, ds, args.rank, args.epoch)
        header = assignment.header
        if args.json:
            body = {
                "name": header.name,
                "epoch": args.epoch,
                "world": header.world.to_json(),
                "seed": header.seed,
                "policy": header.policy.to_json(),
                **{k: v for k, v in report.items() if k not in ("epoch", "ranks")},
                "ranks": shown,
            }
            if args.rank is not None:
                body["rank_spans"] = spans
            print_json({"assignment": body})
            return EXIT_OK
        print(_render(args, header, report, shown, spans))
    return EXIT_OK


def _rank_spans(assignment, ds, rank: int, epoch: int) -> list[dict]:
    out = []
    for worker in range(assignment.world.workers):
        spans = assignment.spans(rank, worker, epoch)
        for seq in range(len(spans)):
            shard = int(spans.shard[seq])
            out.append(
                {
                    "worker": worker,
                    "seq": seq,
                    "shard": shard,
                    "path": ds.manifest.shards[shard].path,
                    "row_start": int(spans.start[seq]),
                    "row_end": int(spans.end[seq]),
                }
            )
    return out


def _render(args, header, report: dict, ranks: list[dict], spans: list[dict]) -> str:
    w, s = header.world, report["summary"]
    lines = [
        f"assignment     {header.name} (epoch {args.epoch} of {[e.epoch for e in header.epochs]})",
        f"world          {w.nodes} nodes x {w.gpus_per_node} GPUs = {w.nodes * w.gpus_per_node} ranks, "
        f"{w.workers} workers each",
        f"policy         {header.policy.mode}, batch {header.policy.batch_size or '-'}, "
        f"seed {header.seed}, block {report['block_rows']} rows",
        f"samples/rank   {report['samples_per_rank']:,} (equal: {report['samples_equal']}); "
        f"dropped {report['dropped']:,}, padded {report['padded']:,}",
        f"bytes/rank     min {format_size(s['bytes']['min'])}  max {format_size(s['bytes']['max'])}  "
        f"max/mean {report['bytes_max_over_mean']:.4f}",
        f"spans/rank     min {s['spans']['min']:,}  max {s['spans']['max']:,}",
        f"home share     min {s['home_share']['min']:.4f}  (bytes each rank reads from its node's shard set)",
        *(
            [
                f"row groups     {g['runs']:,} runs in {g['groups']:,} groups "
                f"({g['runs_per_group']:.2f} per group: each run is at most one decode)"
            ]
            if (g := report.get("row_group_runs"))
            else []
        ),
        "",
        *format_table(
            ("rank", "node", "samples", "bytes", "spans", "home"),
            [
                (
                    r["rank"],
                    r["node"],
                    f"{r['samples']:,}",
                    format_size(r["bytes"]),
                    f"{r['spans']:,}",
                    f"{r['home_share']:.4f}",
                )
                for r in ranks
            ],
            ">>>>>>",
        ),
    ]
    if spans:
        rows: list[tuple[object, ...]] = []
        for worker in sorted({sp["worker"] for sp in spans}):
            mine = [sp for sp in spans if sp["worker"] == worker]
            rows += [
                (worker, sp["seq"], sp["path"], f"[{sp['row_start']}, {sp['row_end']})")
                for sp in mine[:_SPANS_SHOWN]
            ]
            if len(mine) > _SPANS_SHOWN:
                rows.append((worker, "...", f"{len(mine) - _SPANS_SHOWN} more (--json lists all)"))
        lines += ["", *format_table(("worker", "seq", "shard", "rows"), rows, ">><<")]
    return "\n".join(lines)
