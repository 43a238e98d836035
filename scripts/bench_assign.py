#!/usr/bin/env python3
"""Rank-assignment planning benchmark: ``shardfeed.assignment.assign`` against MosaicML Streaming.

What it measures
----------------
One synthetic dataset (10,000,000 samples in 10,000 shards; rows per shard 1000 +- 10%, per-sample
payload sizes from a seeded lognormal with a mean of about 100 KB) is planned for the same world,
128 nodes x 8 GPUs x 8 loader workers, over 2 epochs, by two contenders side by side:

==========  ======================================================================================
shardfeed   ``assign(dataset, World(128, 8, 8), epochs=2, seed=..., name="bench", batch_size=...)``
            end to end: it reads the manifest and ``meta/shardfeed/samples.parquet``, plans both
            epochs and writes ``meta/shardfeed/assignments/bench.{parquet,json}``.
streaming   MosaicML Streaming's own runtime planning, as ``StreamingDataset`` does it for each
            epoch with its defaults (``batching_method='random'``, one stream, no up/down-sampling;
            see ``streaming/base/batching/random.py``): ``get_partitions('orig', ...)`` with
            ``num_canonical_nodes = num_physical_nodes``, then ``get_shuffle('py1e', shard_sizes,
            ...)`` with the block size ``StreamingDataset`` defaults to
            (``max(4_000_000 // num_canonical_nodes, 1 << 18)``), then the step that applies the
            shuffle to the partition (``np.where(ids != -1, shuffle[ids], -1)``). Its
            ``resample_streams`` and final ``small_per_big`` lookup are the identity for one
            unsampled stream and are left out, which only makes Streaming faster.
==========  ======================================================================================

Streaming plans at run time, one epoch at a time, in every node's local leader; shardfeed plans
once, before the job. Both are timed for the whole run (both epochs).

- ``seconds``: wall time of the planning work only. Interpreter start, imports and building the
  synthetic dataset are excluded (imports are reported as ``import s``).
- ``peak RSS``: each contender runs in its own fresh process, so its ``ru_maxrss`` is its own:
  the lifetime peak, imports included (Streaming's ``import streaming`` loads torch, ~300 MB).
  ``work peak`` is the peak during the work alone: the kernel's high-water mark is reset
  (``/proc/self/clear_refs``) after the imports, so it still counts what the imports keep resident.
- ``output``: shardfeed: the bytes of the two files ``assign`` wrote. Streaming: the ``nbytes`` of
  the arrays it produces, each epoch's partition id array plus its shuffle array, summed over the
  epochs.
- shardfeed's result is checked (outside the timing): every epoch present, every rank reads the
  same number of samples, and the spans add up to the header's counts.

How to run
----------
::

    bash scripts/bench_assign.sh            # full size, about 15 s on 2 cores (+ venv setup)
    bash scripts/bench_assign.sh --quick    # 1M samples / 1k shards / 16 nodes, about 6 s
    bash scripts/bench_assign.sh --help

The wrapper creates or reuses ``.venv-bench`` (torch, mosaicml-streaming, shardfeed editable). The
dataset is generated into a temporary directory and removed afterwards unless ``--keep``;
``--workdir DIR`` builds it there instead, keeps it and reuses it on the next run with the same
parameters. ``--repeat N`` runs each contender N times (fresh processes) and keeps the best time;
run-to-run noise on a shared 2-core machine is about 20%.

Targets
-------
shardfeed: at most 3 s, at most 512 MB peak RSS, and ``vs_streaming`` (Streaming's seconds divided
by shardfeed's) at least 1.0. The last line printed is a JSON object that starts with
``{"seconds": s, "peak_rss_mb": m, "output_mb": o, "vs_streaming": r, ...}`` (shardfeed's figures;
MB means 2**20 bytes), followed by Streaming's figures and the run's parameters.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DATASET_VERSION = 1  # bump when the synthetic dataset changes, so --workdir caches are rebuilt
PARAMS_FILE = (
    "bench_assign_params.json"  # in the dataset root, written last: "this dataset is complete"
)
ASSIGNMENTS_DIR = "meta/shardfeed/assignments"
NAME = "bench"
MB = 1 << 20

FULL = {"samples": 10_000_000, "shards": 10_000, "nodes": 128, "gpus": 8, "workers": 8}
QUICK = {"samples": 1_000_000, "shards": 1_000, "nodes": 16, "gpus": 8, "workers": 8}
MEAN_SAMPLE_BYTES = 100_000  # lognormal mean
SIGMA = 1.0  # lognormal shape
ROWS_SPREAD = 0.10  # rows per shard: mean +- 10%
TARGETS = {"seconds": 3.0, "peak_rss_mb": 512.0, "vs_streaming": 1.0}


# --------------------------------------------------------------------------------------------------
# Memory and output helpers (shared by the children)
# --------------------------------------------------------------------------------------------------
def lifetime_peak_mb() -> float:
    """``ru_maxrss`` of this process (KB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _status_mb(key: str) -> float | None:
    try:
        with open("/proc/self/status") as handle:
            for line in handle:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def reset_peak() -> bool:
    """Reset the kernel's RSS high-water mark to the current RSS (Linux >= 4.0)."""
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
        return True
    except OSError:
        return False


def work_peak_mb(was_reset: bool) -> float | None:
    """VmHWM since :func:`reset_peak` (clamped to ``ru_maxrss``, which it may pass by rounding)."""
    hwm = _status_mb("VmHWM") if was_reset else None
    return None if hwm is None else min(hwm, lifetime_peak_mb())


def emit(result: dict) -> None:
    """A child's result: one JSON line, the last line of its stdout."""
    print(json.dumps(result), flush=True)


# --------------------------------------------------------------------------------------------------
# Synthetic dataset
# --------------------------------------------------------------------------------------------------
def synthetic_sizes(samples: int, shards: int, seed: int):
    """Rows per shard (mean +- 10%, summing exactly to ``samples``) and per-sample payload bytes
    (seeded lognormal, mean about 100 KB, within 1 .. 2**32 - 1), both numpy arrays."""
    import numpy as np

    if samples < shards:
        raise ValueError(f"need at least one sample per shard ({samples} < {shards})")
    rng = np.random.default_rng(seed)
    weights = rng.uniform(1 - ROWS_SPREAD, 1 + ROWS_SPREAD, shards)
    rows = np.floor(weights / weights.sum() * samples).astype(np.int64)
    rows = np.maximum(rows, 1)
    short = samples - int(
        rows.sum()
    )  # largest-remainder fix-up: a few shards get one row more/less
    if short:
        pick = rng.choice(np.flatnonzero(rows > (short < 0)), abs(short), replace=False)
        rows[pick] += 1 if short > 0 else -1
    assert int(rows.sum()) == samples and rows.min() >= 1
    mu = math.log(MEAN_SAMPLE_BYTES) - SIGMA**2 / 2
    sizes = rng.lognormal(mu, SIGMA, samples)
    sizes = np.clip(np.rint(sizes), 1, 2**32 - 1).astype(np.uint32)
    return rows, sizes


def write_sample_index_file(root: str, sizes) -> object:
    """``meta/shardfeed/samples.parquet`` through shardfeed's own writer when it has one."""
    try:
        from shardfeed.formats.sample_index import write_sample_index
    except ImportError:
        write_sample_index = None
    if write_sample_index is not None:
        return write_sample_index(root, [sizes])
    import pyarrow as pa
    import pyarrow.parquet as pq

    from shardfeed.formats.meta_writer import file_record

    rel = "meta/shardfeed/samples.parquet"
    schema = pa.schema([pa.field("bytes", pa.uint32(), nullable=False)])
    pq.write_table(
        pa.table([pa.array(sizes)], schema=schema),
        os.path.join(root, rel),
        compression="zstd",
        row_group_size=1 << 20,
    )
    return file_record(root, rel)


def generate_dataset(root: str, samples: int, shards: int, seed: int) -> dict:
    """Write ``meta/info.json``, ``meta/shardfeed/samples.parquet`` and, last, the manifest.

    The data shards themselves are not written: planning reads only the metadata."""
    import numpy as np

    import shardfeed
    from shardfeed.formats.layout import data_path
    from shardfeed.formats.meta_writer import write_info
    from shardfeed.schemas.features import Feature, FeatureSpec
    from shardfeed.schemas.info import Info
    from shardfeed.schemas.manifest import (
        MANIFEST_PATH,
        Manifest,
        Provenance,
        Rejects,
        ShardRecord,
        compute_fingerprint,
    )

    started = time.perf_counter()
    os.makedirs(os.path.join(root, "meta", "shardfeed"), exist_ok=True)
    rows, sizes = synthetic_sizes(samples, shards, seed)
    ends = np.cumsum(rows)
    starts = ends - rows
    payload = np.add.reduceat(sizes.astype(np.int64), starts)
    sized_s = time.perf_counter() - started

    info_record = write_info(
        root, Info(features=FeatureSpec((Feature("payload", "image", ()),)), total_frames=samples)
    )
    index_record = write_sample_index_file(root, sizes)
    records = [
        ShardRecord(
            path=data_path(i),
            bytes=int(payload[i]),
            payload_bytes=int(payload[i]),
            rows=int(rows[i]),
            row_groups=(int(rows[i]),),
            sha256=hashlib.sha256(str(i).encode()).hexdigest(),
            index_start=int(starts[i]),
            index_end=int(ends[i]),
            units=int(rows[i]),
        )
        for i in range(shards)
    ]
    options = {"synthetic": "bench_assign", "seed": seed, "version": DATASET_VERSION}
    files = (info_record, index_record)
    manifest = Manifest(
        num_samples=samples,
        fingerprint=compute_fingerprint([r.sha256 for r in records], options, files),
        shards=tuple(records),
        files=files,
        rejects=Rejects(),
        provenance=Provenance("synthetic:bench_assign", options, shardfeed.__version__),
    )
    with open(os.path.join(root, MANIFEST_PATH), "w") as handle:
        handle.write(manifest.dumps())
    return {
        "seconds": time.perf_counter() - started,
        "sizes_s": sized_s,
        "mean_sample_bytes": float(sizes.mean()),
        "max_sample_bytes": int(sizes.max()),
        "rows_min": int(rows.min()),
        "rows_max": int(rows.max()),
        "total_payload_gb": float(payload.sum()) / 1e9,
        "samples_parquet_mb": index_record.bytes / MB,
        "manifest_mb": os.path.getsize(os.path.join(root, MANIFEST_PATH)) / MB,
    }


def check_dataset(root: str) -> str:
    """Open the synthetic dataset with shardfeed's own readers (outside any timing)."""
    from shardfeed.formats.reader import open_dataset

    ds = open_dataset(root)
    try:
        from shardfeed.formats.sample_index import read_sample_bytes
    except ImportError:
        return f"open_dataset ok ({len(ds)} samples); no sample-index reader to check with"
    sizes = read_sample_bytes(ds)
    return f"open_dataset + read_sample_bytes ok ({len(ds)} samples, {sizes.dtype})"


def child_generate(args: argparse.Namespace) -> None:
    result = generate_dataset(args.dataset, args.samples, args.shards, args.seed)
    result["check"] = check_dataset(args.dataset)
    emit(result)


# --------------------------------------------------------------------------------------------------
# Contender: MosaicML Streaming
# --------------------------------------------------------------------------------------------------
def import_streaming_planners() -> tuple[object, object, str | None]:
    """``get_partitions`` and ``get_shuffle`` through ``import streaming``, as its runtime has them.

    ``import streaming`` imports ``streaming.vision`` and so torchvision; PyPI's torchvision wheels
    can fail to load beside a CPU-only torch (``operator torchvision::nms does not exist``). The
    planners need neither, so a broken torchvision gets an empty ``streaming.vision`` (as in
    bench_convert.py)."""
    note = None
    try:
        import torchvision  # noqa: F401
    except Exception as err:
        for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[name]
        sys.modules["streaming.vision"] = types.ModuleType("streaming.vision")
        note = f"torchvision unusable ({type(err).__name__}); streaming.vision stubbed out"
    import streaming  # noqa: F401  (the whole package, torch included, as a training job has it)
    from streaming.base.partition import get_partitions
    from streaming.base.shuffle import get_shuffle

    return get_partitions, get_shuffle, note


def child_streaming(args: argparse.Namespace) -> None:
    started = time.perf_counter()
    try:
        get_partitions, get_shuffle, note = import_streaming_planners()
    except ImportError as err:
        emit({"error": f"cannot import mosaicml-streaming ({err}); install shardfeed[bench]"})
        sys.exit(3)
    import numpy as np

    import_s = time.perf_counter() - started
    version = _version("mosaicml-streaming")

    # Streaming reads its shard sizes from index.json when the dataset is created, not when it
    # plans an epoch: load them before the clock starts.
    with open(os.path.join(args.dataset, "meta/shardfeed/manifest.json")) as handle:
        shard_sizes = np.array([s["rows"] for s in json.load(handle)["shards"]], dtype=np.int64)
    num_samples = int(shard_sizes.sum())
    canonical = args.nodes  # StreamingDataset's default for py1e: the number of physical nodes
    block_size = max(4_000_000 // canonical, 1 << 18)  # StreamingDataset's default block size
    batch_size = args.batch_size or 1  # Streaming requires one; 1 adds the least padding
    base_mb = _status_mb("VmRSS")
    was_reset = reset_peak()

    phases = {"partition": 0.0, "shuffle": 0.0, "apply": 0.0}
    output_bytes = 0
    epochs = []
    work_started = time.perf_counter()
    for epoch in range(args.epochs):
        t0 = time.perf_counter()
        ids = get_partitions(
            "orig",
            num_samples=num_samples,
            num_canonical_nodes=canonical,
            num_physical_nodes=args.nodes,
            ranks_per_node=args.gpus,
            workers_per_rank=args.workers,
            batch_size=batch_size,
            drop_first=0,
            initial_physical_nodes=None,
        )
        t1 = time.perf_counter()
        shuffle = get_shuffle("py1e", shard_sizes, canonical, args.seed, epoch, block_size)
        t2 = time.perf_counter()
        sample_ids = np.where(ids != -1, shuffle[ids], -1)
        t3 = time.perf_counter()
        phases["partition"] += t1 - t0
        phases["shuffle"] += t2 - t1
        phases["apply"] += t3 - t2
        output_bytes += ids.nbytes + shuffle.nbytes
        epochs.append(
            {
                "epoch": epoch,
                "seconds": t3 - t0,
                "shape": list(ids.shape),
                "pad": int(ids.size) - num_samples,
            }
        )
        del ids, shuffle, sample_ids  # the runtime holds one epoch at a time
    seconds = time.perf_counter() - work_started

    emit(
        {
            "contender": "streaming",
            "version": version,
            "seconds": seconds,
            "core_seconds": phases["partition"] + phases["shuffle"],
            "phases": phases,
            "epochs": epochs,
            "import_s": import_s,
            "base_rss_mb": base_mb,
            "work_peak_rss_mb": work_peak_mb(was_reset),
            "peak_rss_mb": lifetime_peak_mb(),
            "output_bytes": output_bytes,
            "block_size": block_size,
            "batch_size": batch_size,
            "note": note,
        }
    )


# --------------------------------------------------------------------------------------------------
# Contender: shardfeed
# --------------------------------------------------------------------------------------------------
def child_shardfeed(args: argparse.Namespace) -> None:
    started = time.perf_counter()
    try:
        from shardfeed.assignment import World, assign
    except ImportError as err:
        emit(
            {
                "error": f"shardfeed.assignment.assign / World are not importable ({err}); "
                "the assignment API (shardfeed/assignment.py) is not there yet"
            }
        )
        sys.exit(3)
    import_s = time.perf_counter() - started

    out_dir = os.path.join(args.dataset, ASSIGNMENTS_DIR)
    shutil.rmtree(out_dir, ignore_errors=True)  # a fresh write every run (and every repeat)
    world = World(nodes=args.nodes, gpus_per_node=args.gpus, workers=args.workers)
    base_mb = _status_mb("VmRSS")
    was_reset = reset_peak()

    work_started = time.perf_counter()
    result = assign(
        args.dataset,
        world,
        epochs=args.epochs,
        seed=args.seed,
        name=NAME,
        batch_size=args.batch_size,
    )
    seconds = time.perf_counter() - work_started
    work_peak = work_peak_mb(was_reset)
    peak = lifetime_peak_mb()

    files = {p.name: p.stat().st_size for p in Path(out_dir).glob(f"{NAME}.*")}
    emit(
        {
            "contender": "shardfeed",
            "version": _version("shardfeed"),
            "seconds": seconds,
            "import_s": import_s,
            "base_rss_mb": base_mb,
            "work_peak_rss_mb": work_peak,
            "peak_rss_mb": peak,
            "output_bytes": sum(files.values()),
            "files": files,
            "check": check_assignment(result, args),
        }
    )


def check_assignment(result, args: argparse.Namespace) -> dict:
    """Every epoch present; every rank reads the same count; spans add up to the header."""
    import numpy as np

    try:
        header, columns = result.header, result.columns
        ranks = args.nodes * args.gpus
        found = [e.epoch for e in header.epochs]
        problems = []
        if found != list(range(args.epochs)):
            problems.append(f"epochs {found}, expected 0..{args.epochs - 1}")
        epochs = []
        for counts in header.epochs:
            sel = columns["epoch"] == counts.epoch
            rows = (columns["row_end"][sel] - columns["row_start"][sel]).astype(np.int64)
            per_rank = np.bincount(columns["rank"][sel], weights=rows, minlength=ranks)
            if per_rank.min() != per_rank.max() or per_rank[0] != counts.samples_per_rank:
                problems.append(
                    f"epoch {counts.epoch}: ranks read {int(per_rank.min())}..{int(per_rank.max())} "
                    f"samples, header says {counts.samples_per_rank}"
                )
            if counts.samples_per_rank * ranks != args.samples + counts.padded - counts.dropped:
                problems.append(
                    f"epoch {counts.epoch}: {counts.samples_per_rank} x {ranks} ranks != "
                    f"{args.samples} + {counts.padded} padded - {counts.dropped} dropped"
                )
            epochs.append(
                {
                    "epoch": counts.epoch,
                    "spans": int(sel.sum()),
                    "samples_per_rank": counts.samples_per_rank,
                    "padded": counts.padded,
                    "dropped": counts.dropped,
                }
            )
        return {"ok": not problems, "problems": problems, "epochs": epochs}
    except Exception as err:  # the API is young: report, do not hide the timing
        return {"ok": False, "problems": [f"could not check the result: {err!r}"], "epochs": []}


def _version(dist: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return None


# --------------------------------------------------------------------------------------------------
# Parent: dataset once, each contender in a fresh process, table and JSON
# --------------------------------------------------------------------------------------------------
def run_child(kind: str, args: argparse.Namespace, dataset: str) -> dict:
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--_child",
        kind,
        "--_dataset",
        dataset,
        "--_samples",
        str(args.samples),
        "--_shards",
        str(args.shards),
        "--_nodes",
        str(args.nodes),
        "--_gpus",
        str(args.gpus),
        "--_workers",
        str(args.workers),
        "--epochs",
        str(args.epochs),
        "--seed",
        str(args.seed),
    ]
    if args.batch_size is not None:
        cmd += ["--batch-size", str(args.batch_size)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    try:
        result = json.loads(lines[-1])
    except (IndexError, ValueError):
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-15:])
        result = {"error": f"exited {proc.returncode} with no result:\n{tail}"}
    if proc.returncode and "error" not in result:
        result["error"] = f"exited {proc.returncode}"
    return result


def dataset_params(args: argparse.Namespace) -> dict:
    return {
        "version": DATASET_VERSION,
        "samples": args.samples,
        "shards": args.shards,
        "seed": args.data_seed,
    }


def prepare_dataset(args: argparse.Namespace, root: str) -> dict:
    """Generate the dataset into ``root``, or reuse one built there with the same parameters."""
    params_path = os.path.join(root, PARAMS_FILE)
    params = dataset_params(args)
    try:
        with open(params_path) as handle:
            if json.load(handle) == params:
                return {"reused": True}
    except (OSError, ValueError):
        pass
    shutil.rmtree(os.path.join(root, "meta"), ignore_errors=True)
    os.makedirs(root, exist_ok=True)
    gen = argparse.Namespace(**vars(args))
    gen.seed = args.data_seed
    result = run_child("generate", gen, root)
    if "error" in result:
        raise SystemExit(f"bench_assign: building the synthetic dataset failed: {result['error']}")
    with open(params_path, "w") as handle:
        json.dump(params, handle)
    return result


def best(runs: list[dict]) -> dict:
    """Of repeated runs, the fastest; peaks are the largest seen."""
    ok = [r for r in runs if "error" not in r]
    if not ok:
        return runs[-1]
    pick = dict(min(ok, key=lambda r: r["seconds"]))
    for key in ("peak_rss_mb", "work_peak_rss_mb"):
        values = [r[key] for r in ok if r.get(key) is not None]
        pick[key] = max(values) if values else None
    pick["repeats"] = [round(r["seconds"], 3) for r in ok]
    return pick


def fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def print_report(args: argparse.Namespace, data: dict, sf: dict, st: dict) -> dict:
    world = f"{args.nodes}x{args.gpus}x{args.workers}"
    print()
    print(
        f"bench_assign: {args.samples:,} samples in {args.shards:,} shards, world {world} "
        f"({args.nodes * args.gpus} ranks), {args.epochs} epochs, seed {args.seed}, "
        f"batch_size {args.batch_size}"
    )
    if data.get("reused"):
        print("dataset: reused from --workdir")
    else:
        print(
            f"dataset: built in {data['seconds']:.2f} s (sizes {data['sizes_s']:.2f} s); "
            f"rows/shard {data['rows_min']}..{data['rows_max']}, mean sample "
            f"{data['mean_sample_bytes'] / 1e3:.1f} KB, payload {data['total_payload_gb']:.0f} GB; "
            f"samples.parquet {data['samples_parquet_mb']:.1f} MB, manifest "
            f"{data['manifest_mb']:.1f} MB; {data['check']}"
        )
    print()
    header = (
        f"{'contender':<12}{'seconds':>9}{'peak RSS MB':>13}{'work peak MB':>14}"
        f"{'base MB':>9}{'output MB':>11}{'import s':>10}"
    )
    print(header)
    print("-" * len(header))
    for name, r in (("shardfeed", sf), ("streaming", st)):
        if "error" in r:
            print(f"{name:<12}  FAILED: {r['error']}")
            continue
        print(
            f"{name:<12}{r['seconds']:>9.3f}{fmt(r['peak_rss_mb'], '.1f'):>13}"
            f"{fmt(r.get('work_peak_rss_mb'), '.1f'):>14}{fmt(r.get('base_rss_mb'), '.1f'):>9}"
            f"{r['output_bytes'] / MB:>11.2f}{r['import_s']:>10.2f}"
        )
        if name == "streaming":
            ph = r["phases"]
            per = args.epochs
            print(
                f"{'':<12}  phases over {per} epochs: partition {ph['partition']:.3f} s, "
                f"py1e shuffle {ph['shuffle']:.3f} s, apply {ph['apply']:.3f} s "
                f"(per epoch: {ph['partition'] / per:.3f} + {ph['shuffle'] / per:.3f} + "
                f"{ph['apply'] / per:.3f} s)"
            )
            shape = r["epochs"][0]["shape"]
            print(
                f"{'':<12}  partition shape {shape}, {r['epochs'][0]['pad']} padding ids/epoch, "
                f"block size {r['block_size']}, batch size {r['batch_size']}, "
                f"streaming {r['version']}" + (f"; {r['note']}" if r.get("note") else "")
            )
        if name == "shardfeed":
            files = ", ".join(f"{k} {v / MB:.2f} MB" for k, v in sorted(r["files"].items()))
            check = r["check"]
            spans = sum(e["spans"] for e in check["epochs"])
            print(f"{'':<12}  wrote {files}; {spans:,} spans")
            print(
                f"{'':<12}  check: "
                + ("ok" if check["ok"] else "FAILED: " + "; ".join(check["problems"]))
            )
        if len(r.get("repeats", ())) > 1:
            print(f"{'':<12}  repeats (s): {r['repeats']}")

    ours_ok = "error" not in sf
    theirs_ok = "error" not in st
    ratio = st["seconds"] / sf["seconds"] if ours_ok and theirs_ok and sf["seconds"] > 0 else None
    core_ratio = (
        st["core_seconds"] / sf["seconds"] if ours_ok and theirs_ok and sf["seconds"] > 0 else None
    )
    summary = {
        "seconds": round(sf["seconds"], 4) if ours_ok else None,
        "peak_rss_mb": round(sf["peak_rss_mb"], 1) if ours_ok else None,
        "output_mb": round(sf["output_bytes"] / MB, 3) if ours_ok else None,
        "vs_streaming": round(ratio, 3) if ratio is not None else None,
        "vs_streaming_core": round(core_ratio, 3) if core_ratio is not None else None,
        "work_peak_rss_mb": _round(sf.get("work_peak_rss_mb")) if ours_ok else None,
        "streaming_seconds": round(st["seconds"], 4) if theirs_ok else None,
        "streaming_core_seconds": round(st["core_seconds"], 4) if theirs_ok else None,
        "streaming_partition_s": round(st["phases"]["partition"], 4) if theirs_ok else None,
        "streaming_shuffle_s": round(st["phases"]["shuffle"], 4) if theirs_ok else None,
        "streaming_apply_s": round(st["phases"]["apply"], 4) if theirs_ok else None,
        "streaming_peak_rss_mb": round(st["peak_rss_mb"], 1) if theirs_ok else None,
        "streaming_work_peak_rss_mb": _round(st.get("work_peak_rss_mb")) if theirs_ok else None,
        "streaming_output_mb": round(st["output_bytes"] / MB, 3) if theirs_ok else None,
        "samples": args.samples,
        "shards": args.shards,
        "world": {"nodes": args.nodes, "gpus_per_node": args.gpus, "workers": args.workers},
        "epochs": args.epochs,
        "check_ok": sf["check"]["ok"] if ours_ok else None,
    }
    if ours_ok:
        misses = []
        if sf["seconds"] > TARGETS["seconds"]:
            misses.append(f"seconds {sf['seconds']:.2f} > {TARGETS['seconds']}")
        if sf["peak_rss_mb"] > TARGETS["peak_rss_mb"]:
            misses.append(f"peak RSS {sf['peak_rss_mb']:.0f} MB > {TARGETS['peak_rss_mb']:.0f}")
        if ratio is not None and ratio < TARGETS["vs_streaming"]:
            misses.append(f"vs_streaming {ratio:.2f} < {TARGETS['vs_streaming']}")
        print()
        print(
            f"vs_streaming = {fmt(ratio, '.2f')} (partition + shuffle only: "
            f"{fmt(core_ratio, '.2f')}); targets <= {TARGETS['seconds']} s, "
            f"<= {TARGETS['peak_rss_mb']:.0f} MB, vs_streaming >= {TARGETS['vs_streaming']}: "
            + ("all met" if not misses else "missed: " + ", ".join(misses))
        )
        summary["targets_met"] = not misses
    print(json.dumps(summary))
    return summary


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Rank-assignment planning: shardfeed assign vs MosaicML Streaming "
        "(get_partitions 'orig' + get_shuffle 'py1e'); the last line printed is JSON.",
    )
    parser.add_argument(
        "--quick", action="store_true", help="1M samples / 1k shards / 16 nodes x 8 x 8"
    )
    parser.add_argument(
        "--workdir",
        help="build the synthetic dataset here, or reuse one built there with the same parameters; "
        "it is kept (the assignment is removed unless --keep)",
    )
    parser.add_argument(
        "--keep", action="store_true", help="keep the dataset and the assignment it got"
    )
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0, help="planning seed (both contenders)")
    parser.add_argument("--data-seed", type=int, default=0, help="seed of the synthetic sizes")
    parser.add_argument(
        "--batch-size",
        type=int,
        default=None,
        help="per-rank batch size for both (default: none for shardfeed, 1 for Streaming, "
        "which requires one)",
    )
    parser.add_argument(
        "--repeat", type=int, default=1, help="fresh-process runs per contender; best time kept"
    )
    parser.add_argument(
        "--only",
        choices=("shardfeed", "streaming"),
        help="run one contender (the JSON then lacks the ratio)",
    )
    # internal: one child process
    parser.add_argument(
        "--_child", choices=("generate", "streaming", "shardfeed"), help=argparse.SUPPRESS
    )
    parser.add_argument("--_dataset", help=argparse.SUPPRESS)
    for key in ("samples", "shards", "nodes", "gpus", "workers"):
        parser.add_argument(f"--_{key}", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args._child:
        args.dataset = args._dataset
        for key in ("samples", "shards", "nodes", "gpus", "workers"):
            setattr(args, key, getattr(args, f"_{key}"))
        {"generate": child_generate, "streaming": child_streaming, "shardfeed": child_shardfeed}[
            args._child
        ](args)
        return 0

    for key, value in (QUICK if args.quick else FULL).items():
        setattr(args, key, value)
    if args.epochs < 1 or args.repeat < 1:
        parser.error("--epochs and --repeat must be >= 1")

    root = args.workdir or tempfile.mkdtemp(prefix="bench_assign-")
    root = os.path.abspath(root)
    try:
        print(f"bench_assign: dataset in {root}", file=sys.stderr)
        data = prepare_dataset(args, root)
        skipped = {"error": "skipped (--only)"}
        sf = skipped
        st = skipped
        if args.only != "streaming":
            print("bench_assign: running shardfeed", file=sys.stderr)
            sf = best([run_child("shardfeed", args, root) for _ in range(args.repeat)])
        if args.only != "shardfeed":
            print("bench_assign: running streaming", file=sys.stderr)
            st = best([run_child("streaming", args, root) for _ in range(args.repeat)])
        summary = print_report(args, data, sf, st)
    finally:
        if args.keep:
            print(f"bench_assign: kept {root}", file=sys.stderr)
        elif args.workdir:
            shutil.rmtree(os.path.join(root, ASSIGNMENTS_DIR), ignore_errors=True)
        else:
            shutil.rmtree(root, ignore_errors=True)
    failed = ("error" in sf and args.only != "streaming") or (
        "error" in st and args.only != "shardfeed"
    )
    return 1 if failed or summary.get("check_ok") is False else 0


if __name__ == "__main__":
    sys.exit(main())
