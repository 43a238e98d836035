"""What ``shardfeed inspect`` reports: a plain dict built from the manifest and info, no I/O."""

from __future__ import annotations

from typing import Any

import numpy as np

from shardfeed.formats.reader import tier_preference
from shardfeed.planning.assign import EpochPlan, World
from shardfeed.planning.balance import max_over_mean
from shardfeed.planning.spans import RowBytes, row_group_runs
from shardfeed.schemas.info import Info
from shardfeed.schemas.locations import Locations
from shardfeed.schemas.manifest import Manifest


def dataset_summary(manifest: Manifest, info: Info) -> dict[str, Any]:
    """Samples, shards, sizes, compression, balance, features, rejects (and duplicates left out by
    ``convert --dedup``, when it was used) and provenance."""
    sizes = [s.bytes for s in manifest.shards]
    payloads = [s.payload_bytes for s in manifest.shards]
    total, payload = sum(sizes), sum(payloads)
    target = _target_shard_bytes(manifest)
    # a unit larger than the target gets a shard of its own and is left out of the balance
    alone = [
        s.units == 1 and target is not None and s.payload_bytes > target for s in manifest.shards
    ]
    balanced = [s for s, single in zip(manifest.shards, alone, strict=True) if not single]
    return {
        "num_samples": manifest.num_samples,
        "num_shards": len(manifest.shards),
        "num_row_groups": sum(len(s.row_groups) for s in manifest.shards),
        "bytes": total,
        "payload_bytes": payload,
        "compression_ratio": round(payload / total, 4) if total else None,
        "balance": {
            "bytes_max_over_mean": round(max_over_mean([s.bytes for s in balanced]), 4),
            "payload_bytes_max_over_mean": round(
                max_over_mean([s.payload_bytes for s in balanced]), 4
            ),
            "oversized_unit_shards": sum(alone),
        },
        "shard_bytes": {
            "min": min(sizes, default=0),
            "max": max(sizes, default=0),
            "mean": round(total / len(sizes)) if sizes else 0,
        },
        "episodes": info.total_episodes,
        "tasks": info.total_tasks,
        "fps": info.fps,
        "robot_type": info.robot_type,
        "features": {
            f.name: {"dtype": f.dtype, "shape": list(f.shape), "stored": f.stored}
            for f in info.features
        },
        "rejects": manifest.rejects.to_json(),
        **({"duplicates": manifest.duplicates.to_json()} if manifest.duplicates else {}),
        **({"splits": _splits(manifest, info)} if manifest.splits else {}),
        "fingerprint": manifest.fingerprint,
        "encoding": manifest.encoding,
        "format_version": manifest.format_version,
        "provenance": manifest.provenance.to_json(),
    }


def _splits(manifest: Manifest, info: Info) -> dict[str, Any]:
    """Per named split: its rows, shards, ``info.json`` range and shard balance."""
    out = {}
    for split in manifest.splits:
        shards = manifest.shards[split.shard_start : split.shard_end]
        out[split.name] = {
            "index_start": split.index_start,
            "index_end": split.index_end,
            "rows": split.index_end - split.index_start,
            "shards": [split.shard_start, split.shard_end],
            "info_range": info.splits.get(split.name),
            "bytes": sum(s.bytes for s in shards),
            "bytes_max_over_mean": round(max_over_mean([s.bytes for s in shards]), 4),
            "payload_bytes_max_over_mean": round(
                max_over_mean([s.payload_bytes for s in shards]), 4
            ),
        }
    return out


def staging_summary(manifest: Manifest, locations: Locations) -> dict[str, Any]:
    """A staged dataset's tiers and copies, both in the order readers try tiers.

    ``tiers`` maps each tier to its scope, URI, completeness, read bandwidth (bytes/s) and the
    shards and shard bytes it holds verified copies of; a node tier's counts are None (each node
    holds its own subset, filled by ``shardfeed warm``). ``copies`` lists, per shard, the shared
    tiers holding it.
    """
    order = tier_preference(locations)
    copies = [[t for t in order if t in locations.files.get(s.path, ())] for s in manifest.shards]
    tiers = {}
    for name in order:
        copy = locations.tiers[name]
        held = [s for s, names in zip(manifest.shards, copies, strict=True) if name in names]
        node = copy.scope == "node"
        tiers[name] = {
            "scope": copy.scope,
            "uri": copy.uri,
            "complete": copy.complete,
            "read_bandwidth": copy.read_bandwidth,
            "shards": None if node else len(held),
            "bytes": None if node else sum(s.bytes for s in held),
        }
    return {"tiers": tiers, "copies": copies}


def _target_shard_bytes(manifest: Manifest) -> int | None:
    """The conversion's target shard size, from the provenance's content options (if recorded)."""
    value = manifest.provenance.content_options.get("target_shard_size")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def assignment_summary(
    plan: EpochPlan, span_bytes: np.ndarray, world: World, row_bytes: RowBytes | None = None
) -> dict[str, Any]:
    """Per rank: node, samples, exact bytes, spans and the share of bytes from its node's home
    shard set; per node: its shard set and bytes; and the balance over ranks. With ``row_bytes``
    holding the row-group layout, also the row-group decodes the loaders will make."""
    ranks = world.ranks
    samples = np.bincount(plan.rank, weights=plan.spans.rows, minlength=ranks).astype(np.int64)
    nbytes = np.bincount(plan.rank, weights=span_bytes, minlength=ranks).astype(np.int64)
    spans = np.bincount(plan.rank, minlength=ranks)
    home = np.bincount(plan.rank, weights=span_bytes * plan.home, minlength=ranks)
    share = np.divide(home, nbytes, out=np.ones(ranks), where=nbytes > 0)
    node = np.arange(ranks) // world.gpus_per_node
    node_of_span = plan.rank // world.gpus_per_node
    nodes = []
    for n in range(world.nodes):
        mine = node_of_span == n
        nodes.append(
            {
                "node": n,
                "home_shards": len(np.unique(plan.spans.shard[mine & plan.home])),
                "shards_read": len(np.unique(plan.spans.shard[mine])),
                "bytes": int(span_bytes[mine].sum()),
                "home_share": round(
                    float(home[node == n].sum() / max(1, nbytes[node == n].sum())), 4
                ),
            }
        )
    return {
        "epoch": plan.epoch,
        "samples_per_rank": plan.samples_per_rank,
        "dropped": plan.dropped,
        "padded": plan.padded,
        "block_rows": plan.block_rows,
        "ranks": [
            {
                "rank": r,
                "node": int(node[r]),
                "samples": int(samples[r]),
                "bytes": int(nbytes[r]),
                "spans": int(spans[r]),
                "home_share": round(float(share[r]), 4),
            }
            for r in range(ranks)
        ],
        "nodes": nodes,
        **(
            {"row_group_runs": _group_runs(plan, world, row_bytes)}
            if row_bytes is not None and row_bytes.groups is not None
            else {}
        ),
        "samples_equal": bool(samples.min() == samples.max()) if ranks else True,
        "bytes_max_over_mean": round(max_over_mean(nbytes.tolist()), 4),
        "summary": {
            name: {
                "min": int(values.min()) if name != "home_share" else float(values.min()),
                "max": int(values.max()) if name != "home_share" else float(values.max()),
                "max_over_mean": round(max_over_mean(values.tolist()), 4),
            }
            for name, values in (
                ("samples", samples),
                ("bytes", nbytes),
                ("spans", spans),
                ("home_share", np.round(share, 4)),
            )
        },
    }


def _group_runs(plan: EpochPlan, world: World, row_bytes: RowBytes) -> dict[str, Any]:
    """Runs (a stretch of one worker's rows inside one row group: the loader decodes a group at
    most once per run, fewer times when it keeps it for a run close behind) against the groups
    touched. Well above 1 per group, ranks decode groups they share."""
    runs, touched = row_group_runs(
        plan.spans, plan.rank * world.workers + plan.worker, row_bytes.groups, row_bytes.offsets
    )
    sizes = np.diff(row_bytes.groups)
    return {
        "runs": runs,
        "groups": touched,
        "runs_per_group": round(runs / max(touched, 1), 3),
        "mean_group_rows": round(float(sizes.mean()), 1) if len(sizes) else 0.0,
    }
