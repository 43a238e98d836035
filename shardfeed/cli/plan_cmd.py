"""``shardfeed plan DATASET``: the read bandwidth a training world needs, and whether the tiers
keep up (``shardfeed/planning/bandwidth.py`` holds the arithmetic; docs/PLANNING.md explains it)."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

from shardfeed.cli._common import EXIT_OK, EXIT_USAGE, fail, print_json
from shardfeed.planning.bandwidth import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_LATENCY_S,
    DEFAULT_WORKER_BYTES_PER_S,
    MB,
    OK_HEADROOM,
    TIGHT_HEADROOM,
    BandwidthPlan,
    LoaderModel,
    NodeCache,
    SharedTier,
    Workload,
    plan_bandwidth,
    uniform_coverage,
)
from shardfeed.schemas.units import format_decimal_size, format_rate, parse_share, parse_size


def _budget(text: str) -> tuple[str, float]:
    """``--hot-budget``: ('share', 0..1) for '10%', ('bytes', n) for a size."""
    try:
        share = parse_share(text)
        return ("share", share) if share is not None else ("bytes", float(parse_size(text)))
    except (ValueError, OverflowError) as err:
        raise argparse.ArgumentTypeError(f"{err} (or a percentage like 10%)") from None


def _size(text: str) -> int:
    try:
        value = parse_size(text)
    except (ValueError, OverflowError) as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be > 0")
    return value


def _share(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a number in 0..1") from None
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a number in 0..1")
    return value


def _positive(kind: type) -> Callable[[str], float]:
    def convert(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: expected a {kind.__name__}") from None
        if not value > 0 or not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text!r}: must be > 0")
        return value

    return convert


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a number") from None
    if not 0 <= value < math.inf:
        raise argparse.ArgumentTypeError(f"{text!r}: must be >= 0")
    return value


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "plan",
        help="plan read bandwidth: GB/s per node and in aggregate, node cache vs shared tier, "
        "loader workers, prefetch depth, minimum shards",
        description=(
            "Plan the read bandwidth a training world needs from this dataset. Demand is "
            "GPUs x samples/s per GPU x on-disk bytes per sample (compressed bytes are what "
            "cross the network; GB = 10^9). A node cache of --hot-budget serves the share the "
            "dataset's hot index says (shardfeed hot), or budget / dataset if it has none "
            "(uniform access); the shared tier (the first shared tier of the policy's 'all' "
            "list in --tiers) serves the rest. The verdict compares declared with needed "
            f"bandwidth per tier: ok at headroom >= {OK_HEADROOM}, tight at >= "
            f"{TIGHT_HEADROOM}, short below. Also recommends loader workers per rank, prefetch "
            "depth and the minimum shard count for the world. Nothing is written. See "
            "docs/PLANNING.md."
        ),
    )
    parser.add_argument("dataset", help="dataset directory or URI (only its manifest is read)")
    world = parser.add_argument_group("world")
    world.add_argument("--gpus", type=_positive(int), required=True, help="GPUs (ranks) in the job")
    world.add_argument(
        "--gpus-per-node",
        type=_positive(int),
        required=True,
        help="GPUs per node (--gpus must be a multiple)",
    )
    world.add_argument(
        "--samples-per-gpu-per-s",
        type=_positive(float),
        required=True,
        metavar="R",
        help="samples each GPU consumes per second at full speed",
    )
    world.add_argument(
        "--bytes-per-sample",
        type=_size,
        metavar="SIZE",
        help="model samples of this on-disk size, e.g. 125KB (default: the dataset's "
        "sum(shard bytes) / samples)",
    )
    tiers = parser.add_argument_group("tiers and node cache")
    tiers.add_argument(
        "--tiers",
        metavar="TIERS.toml",
        help="tier config: the node tier (first node-scope tier of policy 'hot', else 'all') and "
        "the shared tier that serves reads (first shared tier of policy 'all'), with their "
        "declared read bandwidths; without it there is no verdict",
    )
    tiers.add_argument(
        "--hot-budget",
        type=_budget,
        metavar="SIZE|PCT",
        help="node cache per node, as a size (3TB) or a share of the dataset's payload (10%%), "
        "counted like shardfeed hot --node-budget (default: the node tier's capacity, else 0: "
        "no cache)",
    )
    tiers.add_argument(
        "--hot-coverage",
        type=_share,
        metavar="SHARE",
        help="assume the node cache serves this share (0..1) of read bytes, e.g. a measured hit "
        "rate, instead of asking the hot index",
    )
    loader = parser.add_argument_group("loader assumptions")
    loader.add_argument(
        "--worker-mb-per-s",
        type=_positive(float),
        default=DEFAULT_WORKER_BYTES_PER_S / MB,
        metavar="MBPS",
        help="MB/s (10^6) one loader worker sustains, read + decode "
        f"(default {DEFAULT_WORKER_BYTES_PER_S / MB:g})",
    )
    loader.add_argument(
        "--latency-ms",
        type=_non_negative_float,
        default=DEFAULT_LATENCY_S * 1000,
        metavar="MS",
        help=f"first-byte latency of the shared tier (default {DEFAULT_LATENCY_S * 1000:g} ms)",
    )
    loader.add_argument(
        "--batch-size",
        type=_positive(int),
        default=DEFAULT_BATCH_SIZE,
        help=f"samples per rank per step (default {DEFAULT_BATCH_SIZE})",
    )
    parser.add_argument("--json", action="store_true", help="print inputs and plan as JSON")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from shardfeed.formats.reader import open_dataset
    from shardfeed.schemas.tiers import load_tier_config

    config = load_tier_config(args.tiers) if args.tiers else None
    node_tier = config.node_tier if config else None
    read_tier = config.read_tier if config else None
    with open_dataset(args.dataset) as ds:
        manifest = ds.manifest
        disk_bytes = sum(s.bytes for s in manifest.shards)
        payload_bytes = sum(s.payload_bytes for s in manifest.shards)
        hot_set = sum(s.payload_bytes for s in manifest.shards[: manifest.hot_shards])
        if args.bytes_per_sample is not None:
            bytes_per_sample, bps_source = float(args.bytes_per_sample), "--bytes-per-sample"
        elif manifest.num_samples:
            bytes_per_sample, bps_source = disk_bytes / manifest.num_samples, "manifest"
        else:
            return fail("the dataset has no samples; pass --bytes-per-sample", EXIT_USAGE)

        if args.hot_budget is not None:
            kind, value = args.hot_budget
            budget = int(value * payload_bytes) if kind == "share" else int(value)
            budget_source = "--hot-budget"
        elif node_tier is not None:
            budget, budget_source = node_tier.capacity, f"capacity of node tier {node_tier.name}"
        else:
            budget, budget_source = 0, "no --hot-budget and no node tier"

        coverage, coverage_source = None, "none (no node cache)"
        if args.hot_coverage is not None:
            if budget <= 0:
                return fail(
                    "--hot-coverage needs a node cache: give --hot-budget or a node tier in --tiers",
                    EXIT_USAGE,
                )
            share = args.hot_coverage
            coverage, coverage_source = (lambda _budget: share), "--hot-coverage"
        elif budget > 0:
            coverage, coverage_source = _hot_index_coverage(ds, payload_bytes)

    workload = Workload(
        gpus=args.gpus,
        gpus_per_node=args.gpus_per_node,
        samples_per_gpu_per_s=args.samples_per_gpu_per_s,
        bytes_per_sample=bytes_per_sample,
        dataset_bytes=disk_bytes,
        num_shards=len(manifest.shards),
        hot_set_bytes=hot_set,
    )
    cache = NodeCache(
        budget_bytes=budget,
        coverage=coverage,
        read_bandwidth=node_tier.read_bandwidth if node_tier else None,
        capacity=node_tier.capacity if node_tier else None,
        name=node_tier.name if node_tier else None,
    )
    shared = SharedTier(read_tier.name, read_tier.read_bandwidth) if read_tier else None
    loader = LoaderModel(
        worker_bytes_per_s=args.worker_mb_per_s * MB,
        latency_s=args.latency_ms / 1000,
        batch_size=args.batch_size,
    )
    plan = plan_bandwidth(workload, cache, shared, loader)
    inputs = {
        "dataset": args.dataset,
        "gpus": args.gpus,
        "gpus_per_node": args.gpus_per_node,
        "samples_per_gpu_per_s": args.samples_per_gpu_per_s,
        "bytes_per_sample": bytes_per_sample,
        "bytes_per_sample_source": bps_source,
        "num_samples": manifest.num_samples,
        "dataset_bytes": disk_bytes,
        "dataset_payload_bytes": payload_bytes,
        "num_shards": len(manifest.shards),
        "hot_shards": manifest.hot_shards,
        "hot_budget_bytes": budget,
        "hot_budget_source": budget_source,
        "coverage_source": coverage_source,
        "tiers": args.tiers,
        "worker_bytes_per_s": loader.worker_bytes_per_s,
        "latency_s": loader.latency_s,
        "batch_size": loader.batch_size,
    }
    if args.json:
        print_json({"inputs": inputs, "plan": plan.to_json()})
        return EXIT_OK
    _print_plan(inputs, plan)
    return EXIT_OK


def _hot_index_coverage(ds, payload_bytes: int):
    """The hot index's coverage function, or uniform access when the dataset has none."""
    from shardfeed.hot import HotIndexMissingError, load_hot_index

    try:
        hot = load_hot_index(ds)
    except HotIndexMissingError:
        return (
            uniform_coverage(payload_bytes),
            "uniform access (the dataset has no hot index; run shardfeed hot): "
            "coverage = min(1, budget / dataset payload)",
        )
    return hot.coverage, "hot index"


def _headroom_text(headroom: float | None) -> str:
    return "-" if headroom is None else f"{headroom:.2f}x"


def _print_plan(inputs: dict, p: BandwidthPlan) -> None:
    print(
        f"plan for {inputs['dataset']}: {inputs['gpus']:,} GPUs = {p.nodes:,} nodes x "
        f"{inputs['gpus_per_node']}, {inputs['samples_per_gpu_per_s']:,g} samples/s per GPU x "
        f"{format_decimal_size(inputs['bytes_per_sample'])} per sample on disk "
        f"({inputs['bytes_per_sample_source']})"
    )
    print("demand (GB = 10^9)")
    print(f"  per GPU      {format_rate(p.per_gpu_bytes_per_s)}")
    print(f"  per node     {format_rate(p.per_node_bytes_per_s)}")
    print(f"  aggregate    {format_rate(p.aggregate_bytes_per_s)}")
    print(
        f"node tier {p.node_tier or '(none declared)'}: hot budget "
        f"{format_decimal_size(p.hot_budget_bytes)} per node ({inputs['hot_budget_source']})"
    )
    print(f"  coverage     {inputs['coverage_source']}")
    node_line = (
        f"  serves       {p.node_share:.1%} of reads = {format_rate(p.node_served_bytes_per_s)} "
        "per node"
    )
    if p.node_declared_bytes_per_s is not None:
        node_line += (
            f" (declared {format_rate(p.node_declared_bytes_per_s)} per node, headroom "
            f"{_headroom_text(p.node_headroom)})"
        )
    print(node_line)
    print(f"shared tier {p.shared_tier or '(none declared)'}")
    shared_line = f"  needs        {format_rate(p.shared_needed_bytes_per_s)}"
    if p.shared_declared_bytes_per_s is not None:
        shared_line += (
            f" (declared {format_rate(p.shared_declared_bytes_per_s)}, headroom "
            f"{_headroom_text(p.shared_headroom)})"
        )
    print(shared_line)
    limit = f" on {p.limiting_tier}" if p.limiting_tier else ""
    print(
        f"verdict: {p.verdict.upper()}, headroom {_headroom_text(p.headroom)}{limit} "
        f"(ok >= {OK_HEADROOM}, tight >= {TIGHT_HEADROOM}, short below)"
    )
    print(
        f"loader: {p.workers_per_rank} worker{'s' if p.workers_per_rank > 1 else ''} per rank "
        f"at {format_rate(inputs['worker_bytes_per_s'])} "
        f"each ({p.loader_workers_per_node} per node: keep that many CPU cores free), prefetch "
        f"depth {p.prefetch_depth} batches of {inputs['batch_size']} "
        f"({inputs['latency_s'] * 1000:g} ms latency; DataLoader prefetch_factor "
        f"{p.prefetch_factor})"
    )
    have = "ok" if p.shards_ok else "too few"
    print(
        f"shards: at least {p.min_shards:,} for this world ({p.min_shards_per_node} per node); "
        f"the dataset has {p.num_shards:,} ({have})"
    )
    for note in p.notes:
        print(f"note: {note}")
