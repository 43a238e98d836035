#!/usr/bin/env python3
"""Object-store soak: verify and the loader through a fault-injecting proxy, against a fault-free run.

A dataset written with ``write_dataset`` is sent to a moto S3 server on loopback. Every read then
goes through ``tests/s3_proxy.py``: first with no fault, then with every ``--period``-th request
failed, the fault kinds taken in turn. Each run verifies the dataset (hashing every byte) and reads
``--epochs`` epochs with ``ShardLoader``; the faulted run must deliver exactly the samples of the
fault-free one. The client is pyarrow's S3 filesystem as ``locate`` wraps it (formats/retrying_fs.py)
with a 1 s request timeout, so a slow answer costs a timeout and a retry.
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

import numpy as np  # noqa: E402
import pyarrow.fs as pafs  # noqa: E402
from s3_proxy import FAULTS, RecordingProxy, s3_filesystem, start_moto  # noqa: E402

from shardfeed import open_dataset, write_dataset  # noqa: E402
from shardfeed.formats.retry import BACKOFF_ENV, retry_counts  # noqa: E402
from shardfeed.formats.verify import verify_dataset  # noqa: E402
from shardfeed.loader import ShardLoader  # noqa: E402

KINDS = [f for f in FAULTS if f != "complete_200_error"]  # reads complete no upload


def run(fs: pafs.FileSystem, uri: str, epochs: int) -> tuple[float, list[int], bool]:
    started = time.perf_counter()
    ok = verify_dataset(uri, filesystem=fs).ok
    delivered = []
    for epoch in range(epochs):
        ds = open_dataset(uri, filesystem=fs)
        with ShardLoader(ds, rank=0, world=1, batch_size=256, epoch=epoch) as loader:
            delivered.extend(int(v) for batch in loader for v in batch["label"])
        ds.close()
    return time.perf_counter() - started, delivered, ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20_000, help="samples in the dataset")
    parser.add_argument("--period", type=int, default=10, help="one fault every N requests")
    parser.add_argument("--epochs", type=int, default=3, help="loader epochs per run")
    args = parser.parse_args(argv)
    if args.period < 2:
        parser.error("--period must be at least 2")
    os.environ.setdefault(BACKOFF_ENV, "0.05")
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's request log
    server, host, direct = start_moto()
    proxy = RecordingProxy(host).start()
    try:
        rng = np.random.default_rng(0)
        with tempfile.TemporaryDirectory() as tmp:
            data = {
                "x": rng.normal(size=(args.rows, 16)).astype(np.float32),
                "label": np.arange(args.rows),
                "text": [f"sample {i} " * (i % 7) for i in range(args.rows)],
            }
            features = {
                "x": {"dtype": "float32", "shape": [16], "names": None},
                "label": {"dtype": "int64", "shape": [1], "names": None},
                "text": {"dtype": "string", "shape": [1], "names": None},
            }
            write_dataset(tmp, features, data, target_shard_size="256KB", row_group_size="32KB")
            pafs.copy_files(tmp, "bucket/soak", pafs.LocalFileSystem(), direct)
        client = s3_filesystem(proxy.host, request_timeout=1.0, connect_timeout=1.0)
        uri = "s3://bucket/soak"
        clean_s, clean, clean_ok = run(client, uri, args.epochs)
        clean_requests = len(proxy.requests)
        proxy.clear()
        seen = collections.Counter()
        lock = threading.Lock()

        def schedule(request, port):
            with lock:
                n = seen["n"]
                seen["n"] += 1
            return None if n % args.period else KINDS[(n // args.period) % len(KINDS)]

        proxy.hook = schedule
        before = retry_counts()
        faulted_s, faulted, faulted_ok = run(client, uri, args.epochs)
        proxy.hook = None
        after = retry_counts()
    finally:
        proxy.stop()
        server.stop()
    faults = collections.Counter(kind for kind, _ in proxy.injected)
    # the same samples as the fault-free run (batches are padded to whole batches of 256), and
    # every sample in every epoch
    same = collections.Counter(faulted) == collections.Counter(clean) and set(clean) == set(
        range(args.rows)
    )
    summary = {
        "ok": bool(clean_ok and faulted_ok and same),
        "rows": args.rows,
        "epochs": args.epochs,
        "requests_fault_free": clean_requests,
        "requests": len(proxy.requests),
        "faults": dict(sorted(faults.items())),
        "fault_share": round(sum(faults.values()) / max(1, len(proxy.requests)), 3),
        "retries": after.get("retries", 0) - before.get("retries", 0),
        "gave_up": after.get("gave_up", 0) - before.get("gave_up", 0),
        "fault_free_s": round(clean_s, 2),
        "faulted_s": round(faulted_s, 2),
        "time_added_s": round(faulted_s - clean_s, 2),
        "cpus": os.cpu_count(),
    }
    print(
        f"verify + {args.epochs} loader epochs of {args.rows:,} samples over S3 (moto, loopback): "
        f"{clean_s:.2f} s fault-free, {faulted_s:.2f} s with one request in {args.period} failed"
    )
    print(f"requests {len(proxy.requests):,} ({clean_requests:,} fault-free); faults by kind:")
    for kind, count in sorted(faults.items()):
        print(f"  {kind:<20} {count}")
    print(
        f"retries {summary['retries']}, gave up {summary['gave_up']}; samples delivered "
        f"{'the same as' if same else 'DIFFERENT from'} the fault-free run's"
    )
    print(json.dumps(summary), flush=True)
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
