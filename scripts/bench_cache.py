#!/usr/bin/env python3
"""Node-cache benchmark: hot-index pinning against demand caches on a skewed sampling workload.

What it measures
----------------
One seeded trace of weighted sampling with replacement is replayed through four cache policies,
and for each the traffic to the shared tier (the parallel file system or object store) is counted:

==============  =================================================================================
no cache        every access reads the sample from the shared tier (one request, its bytes).
sample LRU      per node, a sample-level LRU of ``budget`` bytes filled on demand, as a generic
                cache (fscache, Alluxio) does: a miss reads the sample (one request) and inserts
                it, evicting the least recently used samples until it fits. A sample larger than
                the whole budget is never cached.
shard LRU       per node, a shard-level LRU of ``budget`` bytes, as Streaming's and WebDataset's
                local caches do: a miss reads the whole shard (one request, the shard's bytes)
                and caches it; any later access to a sample of a cached shard is a hit.
pinning         per node, the hot set of ``shardfeed.planning.hot``:
                ``node_pins(accesses_from_weights(weights, N), sizes, budget, nodes=nodes)``.
                It is staged before the job (reported separately) and never changes during
                training: a pinned sample is a hit, any other access reads the shared tier.
                No demand fill: the first-fit pin set leaves less than one sample of room.
==============  =================================================================================

Training traffic (shared-tier bytes and requests while the job runs) is reported per policy and
per epoch, so the warm-up of the demand caches shows; the one-time staging traffic of pinning is
reported on its own: pinned bytes per node x nodes, all read from the shared tier, as requests
one per pinned sample and, coalesced, one per run of consecutive sample ids in one shard.

The break-even is the number of epochs after which pinning's total traffic (staging + training
misses) falls below sample LRU's. To find it the same trace is continued past the job's epochs up
to ``--horizon`` epochs (default 20; the first ``--epochs`` are the job, identical draws), with
the demand caches kept warm; past the horizon, pinning's per-epoch misses are their mean (it is
stateless) and sample LRU's those of its last epoch. Staging is paid once per node per job,
unless the node keeps its NVMe between jobs; in that case a sample LRU keeps its warm cache too,
so the same figure counts epochs summed over the jobs that run on those nodes.

Workload and assumptions
------------------------
- ``N`` samples (default 200,000), sizes from a seeded lognormal (mean about 100 KB, sigma 1.0),
  clipped to 1 KB .. 4 MiB. Shards hold consecutive sample ids and close once they reach about
  100 MB (``SHARD_TARGET``), as a size-balanced converter writes them.
- Zipf ranks are a seeded permutation of the sample ids (a converter shuffles rows), so the hot
  samples are spread over all shards. Sample ``i`` of rank ``r`` has weight ``1 / r**s``.
- Each epoch draws ``N`` samples with replacement with probability proportional to the weight;
  draw ``j`` of an epoch goes to node ``j % nodes`` (a round-robin split, as a distributed
  sampler deals one global index list), so every node sees ``1/nodes`` of the draws in order.
- The per-node budget is ``budget x`` the dataset's bytes (default 10%), the same for every policy.
- Requests count reads issued to the shared tier; a GB is 10**9 bytes.

How to run
----------
::

    bash scripts/bench_cache.sh             # full size: 200k samples, 3 epochs, 8 nodes
    bash scripts/bench_cache.sh --quick     # 50k samples
    bash scripts/bench_cache.sh --help      # every option

Pure numpy and Python; the full size runs in a few seconds on two cores.

Targets
-------
``saved_vs_nocache >= 0.5`` (pinning's training bytes against no cache; DESIGN.md target 8) and
``vs_lru >= 1.3`` (sample LRU's training bytes divided by pinning's). The last line printed is a
JSON object that starts with ``{"saved_vs_nocache": f, "vs_lru": r, "staging_gb": g`` followed by
the hit ratios, per-policy training GB, the break-even and the run's parameters.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections import OrderedDict

import numpy as np

from shardfeed.planning.hot import accesses_from_weights, node_pins

SIZE_MEAN = 100_000  # bytes: mean sample payload before clipping
SIZE_SIGMA = 1.0  # lognormal sigma of the sample sizes
SIZE_MIN = 1_000  # bytes
SIZE_MAX = 4 << 20  # 4 MiB
SHARD_TARGET = 100_000_000  # bytes: a shard closes once it holds this much
GB = 1e9

POLICIES = ("no cache", "sample LRU", "shard LRU", "pinning")


def make_dataset(samples: int, zipf: float, seed: int) -> dict[str, np.ndarray]:
    """Sizes, shard of each sample, shard bytes and Zipf weights, all seeded."""
    rng = np.random.default_rng([seed, 0])
    mu = math.log(SIZE_MEAN) - SIZE_SIGMA**2 / 2
    sizes = rng.lognormal(mu, SIZE_SIGMA, samples).clip(SIZE_MIN, SIZE_MAX).astype(np.int64)
    start = np.cumsum(sizes) - sizes  # byte offset of each sample in the dataset
    shard_of = start // SHARD_TARGET
    shard_bytes = np.bincount(shard_of, weights=sizes).astype(np.int64)
    rank = rng.permutation(samples) + 1  # Zipf rank of each sample, independent of its shard
    weights = 1.0 / rank.astype(np.float64) ** zipf
    return {"sizes": sizes, "shard_of": shard_of, "shard_bytes": shard_bytes, "weights": weights}


def draw_trace(weights: np.ndarray, epochs: int, seed: int) -> np.ndarray:
    """``epochs x N`` draws with replacement, probability proportional to ``weights``."""
    rng = np.random.default_rng([seed, 1])
    cdf = np.cumsum(weights)
    cdf /= cdf[-1]
    draws = np.searchsorted(cdf, rng.random((epochs, len(weights))), side="right")
    return np.minimum(draws, len(weights) - 1)


def lru_misses(keys: list[int], key_bytes: np.ndarray, capacity: int) -> np.ndarray:
    """Replay ``keys`` through an LRU of ``capacity`` bytes; True where an access misses.

    A miss inserts the key and evicts the least recently used keys until it fits; a key larger
    than the capacity is never inserted."""
    cost = key_bytes.tolist()
    cache: OrderedDict[int, None] = OrderedDict()
    touch, evict = cache.move_to_end, cache.popitem
    used = 0
    miss = np.zeros(len(keys), dtype=bool)
    for j, key in enumerate(keys):
        if key in cache:
            touch(key)
            continue
        miss[j] = True
        size = cost[key]
        if size > capacity:
            continue
        cache[key] = None
        used += size
        while used > capacity:
            used -= cost[evict(last=False)[0]]
    return miss


def simulate(
    data: dict[str, np.ndarray], trace: np.ndarray, nodes: int, budget: int, epochs: int
) -> dict:
    """Per policy and epoch: shared-tier bytes and requests, hits and hit bytes.

    ``trace`` may run past the job's ``epochs`` (for the break-even); shard LRU, which only the
    job's figures need, is replayed over the job's epochs alone."""
    sizes, shard_of, shard_bytes = data["sizes"], data["shard_of"], data["shard_bytes"]
    horizon = trace.shape[0]
    pins = node_pins(
        accesses_from_weights(data["weights"], trace.shape[1]), sizes, budget, nodes=nodes
    )
    tally = {p: np.zeros((4, horizon)) for p in POLICIES}  # rows: bytes, requests, hits, hit bytes
    for node in range(nodes):
        ids = trace[:, node::nodes]  # this node's draws, epoch by epoch, in order
        epoch = np.broadcast_to(np.arange(horizon)[:, None], ids.shape).ravel()
        job = ids[:epochs].size  # the job's accesses are a prefix
        ids = ids.ravel()
        need = sizes[ids]
        pinned = np.zeros(len(sizes), dtype=bool)
        pinned[pins[node]] = True
        shard_miss = np.ones(len(ids), dtype=bool)  # past the job: not replayed, never counted
        shard_miss[:job] = lru_misses(shard_of[ids[:job]].tolist(), shard_bytes, budget)
        outcome = {
            "no cache": (np.ones(len(ids), dtype=bool), need),
            "sample LRU": (lru_misses(ids.tolist(), sizes, budget), need),
            "shard LRU": (shard_miss, shard_bytes[shard_of[ids]]),
            "pinning": (~pinned[ids], need),
        }
        for policy, (miss, read) in outcome.items():
            t = tally[policy]
            t[0] += np.bincount(epoch, weights=np.where(miss, read, 0), minlength=horizon)
            t[1] += np.bincount(epoch, weights=miss, minlength=horizon)
            t[2] += np.bincount(epoch, weights=~miss, minlength=horizon)
            t[3] += np.bincount(epoch, weights=np.where(miss, 0, need), minlength=horizon)
    pinned_ids = np.sort(pins[0])
    breaks = (np.diff(pinned_ids) != 1) | (np.diff(shard_of[pinned_ids]) != 0)
    staging = {
        "bytes": float(sum(int(sizes[p].sum()) for p in pins)),
        "requests": sum(len(p) for p in pins),
        "runs": (1 + int(np.count_nonzero(breaks))) * nodes if len(pinned_ids) else 0,
        "pinned_per_node": len(pins[0]),
        "pinned_bytes_per_node": int(sizes[pins[0]].sum()),
    }
    return {"tally": tally, "staging": staging}


def break_even(pin_epochs: np.ndarray, lru_epochs: np.ndarray, staging: float) -> float | None:
    """Epochs (fractional) after which staging + pinning's misses fall below sample LRU's bytes.

    Past the given epochs pinning costs its mean epoch and LRU its last (warmest) epoch. None
    when pinning never catches up."""
    pin_step, lru_step = float(pin_epochs.mean()), float(lru_epochs[-1])
    pin_total, lru_total = staging, 0.0
    for e in range(len(pin_epochs)):
        pin_next, lru_next = pin_total + float(pin_epochs[e]), lru_total + float(lru_epochs[e])
        if pin_next <= lru_next:  # crossing inside epoch e (both grow linearly within it)
            gap = pin_total - lru_total
            closing = float(lru_epochs[e]) - float(pin_epochs[e])
            return e + gap / closing if gap > 0 else float(e)
        pin_total, lru_total = pin_next, lru_next
    if lru_step <= pin_step:
        return None
    return len(pin_epochs) + (pin_total - lru_total) / (lru_step - pin_step)


def report(result: dict, args: argparse.Namespace, dataset_bytes: int, budget: int) -> dict:
    """Print the tables; return the figures for the JSON line."""
    full, staging = result["tally"], result["staging"]
    tally = {p: t[:, : args.epochs] for p, t in full.items()}  # the job's epochs
    base_bytes = tally["no cache"][0].sum()
    accesses = tally["no cache"][1].sum()
    print(
        f"\nworkload: {args.samples:,} samples, {dataset_bytes / GB:.2f} GB in "
        f"{result['shards']} shards, Zipf s={args.zipf}, {args.epochs} epochs x {args.nodes} nodes, "
        f"budget {args.budget:.0%} = {budget / GB:.2f} GB per node, seed {args.seed}"
    )
    print("\ntraining traffic to the shared tier (all nodes, all epochs)")
    print(
        f"{'policy':<12} {'GB':>9} {'requests':>10} {'hit (req)':>10} {'hit (bytes)':>12} "
        f"{'vs no cache':>12}"
    )
    for policy in POLICIES:
        t = tally[policy]
        print(
            f"{policy:<12} {t[0].sum() / GB:>9.2f} {int(t[1].sum()):>10,} "
            f"{t[2].sum() / accesses:>10.1%} {t[3].sum() / base_bytes:>12.1%} "
            f"{t[0].sum() / base_bytes:>12.3f}"
        )
    print("\nper epoch: shared-tier GB (requests)")
    print(f"{'policy':<12}" + "".join(f" {'epoch ' + str(e + 1):>20}" for e in range(args.epochs)))
    for policy in POLICIES:
        t = tally[policy]
        cells = "".join(
            f" {f'{t[0][e] / GB:.2f} ({int(t[1][e]):,})':>20}" for e in range(args.epochs)
        )
        print(f"{policy:<12}{cells}")
    print(
        f"\npinning staging, once before the job: {staging['bytes'] / GB:.2f} GB from the shared "
        f"tier ({staging['pinned_bytes_per_node'] / GB:.2f} GB x {args.nodes} nodes), "
        f"{staging['requests']:,} requests one per sample ({staging['pinned_per_node']:,} "
        f"pinned per node), {staging['runs']:,} coalesced (consecutive ids in one shard)"
    )
    pin, lru = tally["pinning"][0], tally["sample LRU"][0]
    print(
        f"job total: pinning {(staging['bytes'] + pin.sum()) / GB:.2f} GB (staging "
        f"{staging['bytes'] / GB:.2f} + training {pin.sum() / GB:.2f}), "
        f"sample LRU {lru.sum() / GB:.2f} GB"
    )
    horizon = full["pinning"].shape[1]
    even = break_even(full["pinning"][0], full["sample LRU"][0], staging["bytes"])
    fanout = break_even(full["pinning"][0], full["sample LRU"][0], staging["pinned_bytes_per_node"])

    def epochs(value: float | None) -> str:
        return "never" if value is None else f"after {value:.1f} epochs"

    print(
        f"break-even vs sample LRU: {epochs(even)} of this workload (traced to {horizon} epochs; "
        f"sample LRU's last epoch {full['sample LRU'][0][-1] / GB:.2f} GB, pinning's "
        f"{full['pinning'][0][-1] / GB:.2f} GB)\n"
        "  per job without persistent NVMe; summed over the jobs on the same nodes with it\n"
        f"  {epochs(fanout)} if the pinned set were read from the shared tier once and fanned "
        "out node to node"
    )
    saved, vs_lru = 1 - pin.sum() / base_bytes, lru.sum() / pin.sum()
    print(
        f"targets: saved_vs_nocache {saved:.3f} >= 0.5 {'met' if saved >= 0.5 else 'NOT met'}; "
        f"vs_lru {vs_lru:.3f} >= 1.3 {'met' if vs_lru >= 1.3 else 'NOT met'}"
    )
    return {
        "saved_vs_nocache": round(saved, 4),
        "vs_lru": round(vs_lru, 4),
        "staging_gb": round(staging["bytes"] / GB, 3),
        "staging_requests": staging["requests"],
        "staging_runs": staging["runs"],
        "hit_ratio_pinning": round(tally["pinning"][2].sum() / accesses, 4),
        "hit_ratio_sample_lru": round(tally["sample LRU"][2].sum() / accesses, 4),
        "hit_ratio_shard_lru": round(tally["shard LRU"][2].sum() / accesses, 4),
        "training_gb": {p: round(tally[p][0].sum() / GB, 3) for p in POLICIES},
        "training_requests": {p: int(tally[p][1].sum()) for p in POLICIES},
        "break_even_epochs": None if even is None else round(even, 2),
        "break_even_epochs_fanout": None if fanout is None else round(fanout, 2),
        "samples": args.samples,
        "epochs": args.epochs,
        "nodes": args.nodes,
        "budget_fraction": args.budget,
        "zipf": args.zipf,
        "dataset_gb": round(dataset_bytes / GB, 3),
        "seed": args.seed,
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--samples", type=int, default=200_000, help="dataset size N (default 200000)")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--nodes", type=int, default=8)
    p.add_argument(
        "--budget", type=float, default=0.10, help="per-node cache, share of dataset bytes"
    )
    p.add_argument("--zipf", type=float, default=1.0, help="Zipf exponent s (0 = uniform)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--horizon", type=int, default=20, help="epochs traced for the break-even (default 20)"
    )
    p.add_argument("--quick", action="store_true", help="50,000 samples unless --samples is given")
    args = p.parse_args(argv)
    if args.quick and "--samples" not in (argv if argv is not None else sys.argv[1:]):
        args.samples = 50_000
    if args.samples < 1 or args.epochs < 1 or args.nodes < 1 or not 0 < args.budget <= 1:
        p.error("--samples, --epochs, --nodes must be >= 1 and --budget in (0, 1]")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    began = time.perf_counter()
    data = make_dataset(args.samples, args.zipf, args.seed)
    dataset_bytes = int(data["sizes"].sum())
    budget = int(args.budget * dataset_bytes)
    trace = draw_trace(data["weights"], max(args.epochs, args.horizon), args.seed)
    result = simulate(data, trace, args.nodes, budget, args.epochs)
    result["shards"] = len(data["shard_bytes"])
    figures = report(result, args, dataset_bytes, budget)
    figures["seconds"] = round(time.perf_counter() - began, 2)
    print(f"\nsimulated in {figures['seconds']:.1f} s")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
