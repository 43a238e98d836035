#!/usr/bin/env python3
"""Manifest loading benchmark: ``Manifest.loads`` of a 20,000-shard manifest against ``json.loads``
of the same text, each the best of several runs in one process (issue 23: at most 2x).

Every DataLoader worker on every rank loads the manifest when it starts, so its cost is paid
thousands of times per job. The manifest is generated as ``convert`` writes one (paths
``data/chunk-NNN/file-NNN.parquet``, two row groups, units and footer digests). Also shown, for
context: the record-by-record checks alone (the path a manifest takes when a record is unusual).
Prints a table, then one JSON line: ``{"shards": n, "json_s": a, "loads_s": b, "ratio": b / a,
"record_by_record_s": c}``.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import time


def make_manifest(shards: int) -> str:
    from shardfeed.formats.layout import data_path
    from shardfeed.schemas.manifest import (
        FileRecord,
        Manifest,
        Provenance,
        Rejects,
        ShardRecord,
        compute_fingerprint,
    )

    records, start = [], 0
    for i in range(shards):
        rows = 480 + i % 41
        records.append(
            ShardRecord(
                path=data_path(i),
                bytes=100_000_000 + i,
                payload_bytes=99_000_000 + i,
                rows=rows,
                row_groups=(240, rows - 240),
                sha256=hashlib.sha256(b"%d" % i).hexdigest(),
                index_start=start,
                index_end=start + rows,
                units=rows,
                footer_sha256=hashlib.sha256(b"f%d" % i).hexdigest(),
            )
        )
        start += rows
    files = (FileRecord("meta/info.json", 1000, hashlib.sha256(b"info").hexdigest()),)
    return Manifest(
        num_samples=start,
        fingerprint=compute_fingerprint([r.sha256 for r in records], {"bench": 1}, files),
        shards=tuple(records),
        files=files,
        rejects=Rejects(),
        provenance=Provenance("bench_manifest", {"bench": 1}, "0"),
    ).dumps()


def best(run, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        gc.collect()
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return min(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shards", type=int, default=20_000, help="shards in the manifest")
    parser.add_argument("--repeat", type=int, default=7, help="runs per contender (best kept)")
    args = parser.parse_args()
    if args.shards < 1 or args.repeat < 1:
        parser.error("--shards and --repeat must be positive")

    from shardfeed.schemas import manifest as manifest_module
    from shardfeed.schemas.manifest import Manifest

    text = make_manifest(args.shards)
    json_s = best(lambda: json.loads(text), args.repeat)
    loads_s = best(lambda: Manifest.loads(text), args.repeat)
    plain = manifest_module._decode_usual
    manifest_module._decode_usual = lambda text: None  # the record-by-record checks
    try:
        slow_s = best(lambda: Manifest.loads(text), args.repeat)
    finally:
        manifest_module._decode_usual = plain
    print(f"manifest: {args.shards:,} shards, {len(text) / 1e6:.1f} MB; best of {args.repeat}")
    print(f"{'contender':<22} {'seconds':>8} {'x json.loads':>13}")
    for name, seconds in (
        ("json.loads", json_s),
        ("Manifest.loads", loads_s),
        ("record by record", slow_s),
    ):
        print(f"{name:<22} {seconds:8.3f} {seconds / json_s:13.2f}")
    result = {
        "shards": args.shards,
        "json_s": round(json_s, 4),
        "loads_s": round(loads_s, 4),
        "ratio": round(loads_s / json_s, 2),
        "record_by_record_s": round(slow_s, 4),
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
