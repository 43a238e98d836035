"""What ``shardfeed inspect`` reports: a plain dict built from the manifest and info, no I/O."""

from __future__ import annotations

from typing import Any

from shardfeed.planning.balance import max_over_mean
from shardfeed.schemas.info import Info
from shardfeed.schemas.manifest import Manifest


def dataset_summary(manifest: Manifest, info: Info) -> dict[str, Any]:
    """Samples, shards, sizes, compression, balance, features, rejects and provenance."""
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
        "fingerprint": manifest.fingerprint,
        "encoding": manifest.encoding,
        "format_version": manifest.format_version,
        "provenance": manifest.provenance.to_json(),
    }


def _target_shard_bytes(manifest: Manifest) -> int | None:
    """The conversion's target shard size, from the provenance's content options (if recorded)."""
    value = manifest.provenance.content_options.get("target_shard_size")
    return value if isinstance(value, int) and not isinstance(value, bool) else None
