#!/usr/bin/env python3
"""Text and table kinds of the conversion benchmark (``bench_convert.py --kind text|text-gz|parquet``).

One deterministic corpus of JSON documents (``id``, ``text`` of Zipf-distributed pseudo-words with
log-normal lengths, ``source``, ``score``) is generated once, in 8 files, and converted side by side:

========  =======================================================================================
kind      contenders
========  =======================================================================================
text      ``sf-1w``/``sf-2t``/``sf-2w`` (shardfeed: in-process runner on one thread; on two
          threads, what ``convert`` does by default on 2 cores; 2 multi_processing workers), ``hf``
          (Hugging Face ``datasets``: ``load_dataset("json")``, ``shuffle(seed)``,
          ``flatten_indices()``, ``to_parquet`` per shard), ``mds`` (``MDSWriter``, ``json.loads``
          per line), ``plain`` (one pyarrow pass: ``read_json``, ``take(permutation)``,
          ``write_table`` zstd per shard: the practical limit), ``plain-2p`` (the plain pass
          over half the files in each of two forked processes: ``plain_scale_2p``, how far
          this machine's two cores divide the plain pass, beside shardfeed's ``scale_2w``)
text-gz   the same files as ``.jsonl.gz`` and ``.jsonl.zst``, converted by shardfeed (its default
          runner) into about 4 and about 64 shards, beside the plain ``.jsonl`` at 4 shards
parquet   the same documents as 8 Parquet files: ``sf-1w``, ``sf-2t``, ``sf-2w``, ``hf``
          (``load_dataset("parquet")``, the same steps), ``plain`` (``read_table``, ``take``,
          ``write_table`` zstd) and ``plain-2p``
tfrecord  100,000 ``tf.train.Example`` records in 8 files (int64 and float scalars, an 8-float
          list, UTF-8 text, a varying list of byte strings): ``sf-1w``, ``sf-2t``, ``sf-2w`` and
          ``tfrecord`` (the ``tfrecord`` package's reader, columns into pyarrow, permuted,
          ``write_table`` zstd)
========  =======================================================================================

Every output's sample count is checked (``shardfeed inspect --json``, Parquet footers, MDS's
``index.json``). Each contender runs as in the image kind (``bench_convert._measure``: a fresh
process tree, page cache dropped first when allowed, imports warmed).
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import bench_convert as bc

CORPUS_VERSION = 1
FILES = 8
FULL_DOCS = 12_500  # per file: 100,000 documents, about 140 MB of JSONL
QUICK_DOCS = 2_500  # 20,000 documents, about 28 MB
SEED = 7
PEER_SEED = 0

TEXT_CONTENDERS = ("sf-1w", "sf-2t", "sf-2w", "hf", "mds", "plain", "plain-2p")
TFRECORD_CONTENDERS = ("sf-1w", "sf-2t", "sf-2w", "tfrecord")
TF_FULL, TF_QUICK = 12_500, 2_500  # tf.train.Example records per file (8 files)
PARQUET_CONTENDERS = ("sf-1w", "sf-2t", "sf-2w", "hf", "plain", "plain-2p")
SF_RUNS = ("sf-1w", "sf-2t", "sf-2w")
GZ_CONTENDERS = ("sf-jsonl-4", "sf-gz-4", "sf-gz-64", "sf-zst-4", "sf-zst-64")
SHARDS = 4  # the text and parquet kinds' shard count


# --------------------------------------------------------------------------------------------------
# Corpus


def make_text_corpus(root: Path, docs: int) -> dict:
    """``FILES`` JSONL files of ``docs`` documents each, plus ``.gz``, ``.zst`` and Parquet copies
    under ``root/{jsonl,gz,zst,parquet}`` (reused when the parameters match)."""
    import numpy as np

    params = {"version": CORPUS_VERSION, "files": FILES, "docs": docs, "seed": SEED}
    stamp = root / ".bench-corpus.json"
    if stamp.exists() and json.loads(stamp.read_text()).get("params") == params:
        return json.loads(stamp.read_text())
    shutil.rmtree(root, ignore_errors=True)
    for sub in ("jsonl", "gz", "zst", "parquet"):
        (root / sub).mkdir(parents=True)
    import pyarrow as pa
    import pyarrow.parquet as pq
    import zstandard
    from bench_memory import _word_pool

    words, p = _word_pool(SEED)
    vocab = np.array(words, dtype=object)
    payload = 0
    for n in range(FILES):
        rng = np.random.default_rng([SEED, n])
        lengths = np.clip(rng.lognormal(5.0, 0.8, size=docs).astype(np.int64), 3, 20_000)
        stream = vocab[rng.choice(len(words), size=int(lengths.sum()), p=p)]
        records, start = [], 0
        for i, end in enumerate(np.cumsum(lengths).tolist()):
            text = " ".join(stream[start:end])
            source = f"part-{n:05d}"
            records.append(
                {"id": n * docs + i, "text": text, "source": source, "score": (i % 997) / 997}
            )
            payload += len(text.encode()) + len(source) + 16  # + id and score, 8 bytes each
            start = end
        data = ("\n".join(json.dumps(r) for r in records) + "\n").encode()
        name = f"part-{n:05d}"
        (root / "jsonl" / f"{name}.jsonl").write_bytes(data)
        (root / "gz" / f"{name}.jsonl.gz").write_bytes(gzip.compress(data, 6, mtime=0))
        (root / "zst" / f"{name}.jsonl.zst").write_bytes(zstandard.compress(data, 3))
        pq.write_table(pa.Table.from_pylist(records), root / "parquet" / f"{name}.parquet")
    info = {
        "params": params,
        "samples": FILES * docs,
        "payload": payload,
        "bytes": {s: bc.tree_bytes(root / s)[1] for s in ("jsonl", "gz", "zst", "parquet")},
    }
    stamp.write_text(json.dumps(info))
    return info


def make_tfrecord_corpus(root: Path, per_file: int) -> dict:
    """``FILES`` TFRecord files of ``tf.train.Example`` records (reused when the parameters match):
    ``id``, ``label`` (int64 scalars), ``score`` (a float), ``vec`` (8 floats), ``text`` (UTF-8
    bytes, Zipf words) and ``tags`` (one to three byte strings, so a varying-length list)."""
    import numpy as np
    from bench_memory import _word_pool

    from shardfeed.formats.tf_example import encode_example
    from shardfeed.formats.tfrecord import write_records

    params = {"version": CORPUS_VERSION, "files": FILES, "records": per_file, "seed": SEED}
    stamp = root / ".bench-corpus.json"
    if stamp.exists() and json.loads(stamp.read_text()).get("params") == params:
        return json.loads(stamp.read_text())
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    words, p = _word_pool(SEED)
    vocab = np.array(words, dtype=object)
    for n in range(FILES):
        rng = np.random.default_rng([SEED, 100 + n])
        lengths = rng.integers(5, 60, per_file)
        stream = vocab[rng.choice(len(words), size=int(lengths.sum()), p=p)]
        vecs = rng.normal(size=(per_file, 8)).astype(np.float32)
        records, start = [], 0
        for i, end in enumerate(np.cumsum(lengths).tolist()):
            features = {
                "id": ("int64", [n * per_file + i]),
                "label": ("int64", [i % 10]),
                "score": ("float", [(i % 997) / 997]),
                "vec": ("float", vecs[i]),
                "text": ("bytes", [" ".join(stream[start:end]).encode()]),
                "tags": ("bytes", [b"tag%d" % ((i + k) % 50) for k in range(1 + i % 3)]),
            }
            records.append(encode_example(features))
            start = end
        with open(root / f"part-{n:05d}.tfrecord", "wb") as sink:
            write_records(sink, records)
    info = {"params": params, "samples": FILES * per_file, "bytes": bc.tree_bytes(root)[1]}
    stamp.write_text(json.dumps(info))
    return info


# --------------------------------------------------------------------------------------------------
# Peers (each runs in its own measured process: `bench_convert_text.py _peer NAME SRC DST SHARDS`)


def _inputs(src: str, suffix: str) -> list[str]:
    return sorted(str(p) for p in Path(src).glob(f"*{suffix}"))


def write_parts(table: Any, dst: str, shards: int, first: int = 0) -> None:
    """``table`` cut into ``shards`` equal runs of rows, written as zstd Parquet files numbered
    from ``first``."""
    import numpy as np
    import pyarrow.parquet as pq

    os.makedirs(dst, exist_ok=True)
    bounds = np.linspace(0, table.num_rows, shards + 1).astype(int)
    for k in range(shards):
        part = table.slice(bounds[k], bounds[k + 1] - bounds[k])
        name = f"shard-{first + k:05d}.parquet"
        pq.write_table(part, os.path.join(dst, name), compression="zstd")


def peer_plain(src: str, dst: str, shards: int, fmt: str, processes: int = 1) -> dict:
    """One pyarrow pass: read every file, permute, write ``shards`` zstd Parquet files.
    ``processes`` > 1: the files dealt out over that many forked processes, each permuting its
    own rows and writing its share of the shards, with nothing shared between them: how far
    this machine's two cores divide the plain pass itself, beside shardfeed's ``scale_2w``."""
    started = time.perf_counter()
    files = _inputs(src, ".jsonl" if fmt == "json" else ".parquet")
    if processes == 1:
        rows = _plain_pass(files, dst, shards, fmt, 0)
        return {"work_s": time.perf_counter() - started, "samples": rows}
    children = []
    for k in range(processes):
        pid = os.fork()
        if pid == 0:
            status = 1
            try:
                share = shards // processes
                _plain_pass(files[k::processes], dst, share, fmt, k * share)
                status = 0
            finally:
                os._exit(status)  # a failure's traceback is on stderr already
        children.append(pid)
    if any(os.waitpid(pid, 0)[1] for pid in children):
        raise SystemExit("plain-2p: a process failed")
    import pyarrow.parquet as pq

    rows = sum(pq.ParquetFile(f).metadata.num_rows for f in _inputs(dst, ".parquet"))
    return {"work_s": time.perf_counter() - started, "samples": rows}


def _plain_pass(files: list[str], dst: str, shards: int, fmt: str, first: int) -> int:
    """Read ``files``, permute their rows, write them as ``shards`` files numbered from
    ``first``; the rows written."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.json as pj
    import pyarrow.parquet as pq

    read = pj.read_json if fmt == "json" else pq.read_table
    table = pa.concat_tables(read(f) for f in files)
    table = table.take(np.random.default_rng(PEER_SEED).permutation(table.num_rows))
    write_parts(table, dst, shards, first)
    return table.num_rows


def peer_hf(src: str, dst: str, shards: int, fmt: str) -> dict:
    """Hugging Face ``datasets``: load, shuffle, flatten the indices, write Parquet shards."""
    import tempfile

    import datasets

    datasets.disable_progress_bars()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="hf-cache-", dir=os.path.dirname(dst)) as cache:
        files = _inputs(src, ".jsonl" if fmt == "json" else ".parquet")
        ds = datasets.load_dataset(fmt, data_files=files, split="train", cache_dir=cache)
        ds = ds.shuffle(seed=PEER_SEED).flatten_indices()
        os.makedirs(dst, exist_ok=True)
        for k in range(shards):
            part = ds.shard(num_shards=shards, index=k, contiguous=True)
            part.to_parquet(os.path.join(dst, f"shard-{k:05d}.parquet"))
        rows = ds.num_rows
    return {"work_s": time.perf_counter() - started, "samples": rows}


def peer_mds(src: str, dst: str, shard_bytes: int) -> dict:
    """``MDSWriter`` with one ``json.loads`` per line, zstd-compressed shards."""
    mds_writer, note = bc.import_mds_writer()
    started = time.perf_counter()
    columns = {"id": "int64", "text": "str", "source": "str", "score": "float64"}
    samples = 0
    with mds_writer(
        out=dst, columns=columns, size_limit=shard_bytes, compression="zstd", progress_bar=False
    ) as sink:
        for path in _inputs(src, ".jsonl"):
            with open(path, "rb") as handle:
                for line in handle:
                    sink.write(json.loads(line))
                    samples += 1
    return {"work_s": time.perf_counter() - started, "samples": samples, "note": note}


def peer_tfrecord(src: str, dst: str, shards: int) -> dict:
    """The ``tfrecord`` package's reader into pyarrow: every record parsed (its protobuf
    ``Example``), columns built, permuted and written as ``shards`` zstd Parquet files."""
    import numpy as np
    import pyarrow as pa
    from tfrecord.reader import tfrecord_loader

    started = time.perf_counter()
    kinds = {"id": "int", "label": "int", "score": "float", "vec": "float"}
    kinds.update({"text": "byte", "tags": "byte"})
    columns: dict[str, list] = {name: [] for name in kinds}
    for path in _inputs(src, ".tfrecord"):
        for record in tfrecord_loader(path, None, kinds):
            columns["id"].append(int(record["id"][0]))
            columns["label"].append(int(record["label"][0]))
            columns["score"].append(float(record["score"][0]))
            columns["vec"].append(record["vec"])
            columns["text"].append(record["text"].decode())
            columns["tags"].append(record["tags"])
    vec = np.stack(columns.pop("vec")).astype(np.float32)
    tags = columns.pop("tags")
    table = pa.table(
        {
            **columns,
            "vec": pa.FixedSizeListArray.from_arrays(pa.array(vec.ravel()), 8),
            # one value comes back as bytes, several as a numpy array of bytes
            "tags": pa.array(
                [[t.decode()] if isinstance(t, bytes) else [x.decode() for x in t] for t in tags]
            ),
        }
    )
    table = table.take(np.random.default_rng(PEER_SEED).permutation(table.num_rows))
    write_parts(table, dst, shards)
    return {"work_s": time.perf_counter() - started, "samples": table.num_rows}


def run_peer(argv: list[str]) -> int:
    name, src, dst, shards, fmt, shard_bytes = argv
    if name == "tfrecord":
        out = peer_tfrecord(src, dst, int(shards))
    elif name in ("plain", "plain-2p"):
        out = peer_plain(src, dst, int(shards), fmt, 2 if name == "plain-2p" else 1)
    elif name == "hf":
        out = peer_hf(src, dst, int(shards), fmt)
    else:
        out = peer_mds(src, dst, int(shard_bytes))
    print(json.dumps(out), flush=True)
    return 0


# --------------------------------------------------------------------------------------------------
# Running and checking one contender


#: Beam flags of each shardfeed contender's runner mode (None: ``convert``'s default)
MODES = {
    "1w": ["--direct_num_workers=1"],
    "2t": ["--direct_running_mode=multi_threading", "--direct_num_workers=2"],
    "2w": ["--direct_running_mode=multi_processing", "--direct_num_workers=2"],
}


def shardfeed_cmd(src: Path, dst: Path, target: int, mode: str | None) -> list[str]:
    cmd = [sys.executable, "-m", "shardfeed.cli.main", "convert", str(src), str(dst)]
    return [*cmd, "--target-shard-size", str(target), "--json", *MODES.get(mode or "", [])]


def count_output(name: str, dst: Path) -> tuple[int, dict]:
    """Samples in ``dst`` as its own metadata says, and its shard count."""
    if name.startswith("sf-"):
        inspected = bc.inspect_json(dst)
        if inspected["rejects"]["total"]:
            raise SystemExit(f"bench: {name} rejected {inspected['rejects']} of a clean corpus")
        return inspected["num_samples"], {
            "shards": inspected["num_shards"],
            "payload_max_over_mean": inspected["balance"]["payload_bytes_max_over_mean"],
        }
    if name == "mds":
        shards = json.loads((dst / "index.json").read_text())["shards"]
        return sum(s["samples"] for s in shards), {"shards": len(shards)}
    import pyarrow.parquet as pq

    files = sorted(dst.glob("*.parquet"))
    return sum(pq.ParquetFile(f).metadata.num_rows for f in files), {"shards": len(files)}


def run_one(
    name: str,
    cmd: list[str],
    warm: str,
    dst: Path,
    logs: Path,
    expected: int,
    timeout: float,
    can_drop: bool,
    count: Callable[[str, Path], tuple[int, dict]] = count_output,
) -> bc.Result:
    """Run one contender measured, check its output's sample count (``count``), and return
    its result."""
    if dst.exists():
        shutil.rmtree(dst)
    m, stdout, sync_s = bc.measured_run(name, cmd, warm, logs, timeout, can_drop)
    samples, extra = count(name, dst)
    if samples != expected:
        raise SystemExit(f"bench: {name} wrote {samples} samples, expected {expected}")
    reported = bc.last_json(stdout)
    work = reported.get("seconds") if name.startswith("sf-") else reported.get("work_s")
    if reported.get("note"):
        extra["note"] = reported["note"]
    extra["stragglers_killed"] = m["stragglers_killed"]
    return bc.Result.of(name, m, work, sync_s, dst, samples, extra)


WARM_SF = "import apache_beam, shardfeed.cli.main, shardfeed.pipelines.driver"
WARM_SF_2W = WARM_SF + ", apache_beam.runners.worker.sdk_worker_main"


def plan_runs(kind: str, corpus: Path, out: Path, info: dict, names: list[str]) -> list[tuple]:
    """``(name, command, warm imports)`` of each contender of ``kind``."""
    py, me = sys.executable, str(Path(__file__).resolve())
    payload = info["payload"]
    target = payload // SHARDS + 1
    runs = []
    if kind == "text-gz":
        for name in names:
            _, what, shards = name.split("-")
            src = corpus / ("jsonl" if what == "jsonl" else what)
            cmd = shardfeed_cmd(src, out / name, payload // int(shards) + 1, None)
            runs.append((name, cmd, WARM_SF))
        return runs
    src, fmt = {
        "tfrecord": (corpus, ""),
        "text": (corpus / "jsonl", "json"),
        "parquet": (corpus / "parquet", "parquet"),
    }[kind]
    warm = {
        "hf": "import datasets",
        "plain": "import pyarrow.json, pyarrow.parquet",
        "plain-2p": "import pyarrow.json, pyarrow.parquet",
        "tfrecord": "import tfrecord.reader, pyarrow.parquet",
    }
    for name in names:
        if name.startswith("sf-"):
            mode = name.removeprefix("sf-")
            cmd = shardfeed_cmd(src, out / name, target, mode)
            runs.append((name, cmd, WARM_SF_2W if mode == "2w" else WARM_SF))
        else:
            cmd = [py, me, "_peer", name, str(src), str(out / name), str(SHARDS), fmt, str(target)]
            runs.append((name, cmd, warm.get(name, "")))
    return runs


def summarise(kind: str, results: list[bc.Result], samples: int) -> dict:
    """The kind's block of the benchmark's last line: ratios of samples/s on wall time."""
    tput = {r.name: samples / r.wall_s for r in results}
    out: dict = {}

    def ratio(a: str, b: str) -> float | None:
        return round(tput[a] / tput[b], 3) if a in tput and b in tput else None

    if kind == "text-gz":
        out["gz_64_over_4"] = ratio("sf-gz-4", "sf-gz-64")  # time ratio: 64-shard over 4-shard
        out["zst_64_over_4"] = ratio("sf-zst-4", "sf-zst-64")
        out["gz_over_plain"] = ratio("sf-jsonl-4", "sf-gz-4")
        out["zst_over_plain"] = ratio("sf-jsonl-4", "sf-zst-4")
    elif kind == "tfrecord":
        best = max((n for n in SF_RUNS if n in tput), key=tput.get, default=None)
        if best:
            out["vs_tfrecord"] = ratio(best, "tfrecord")
            out["best_shardfeed"] = best
        out["scale_2w"] = ratio("sf-2w", "sf-1w")
        out["scale_2t"] = ratio("sf-2t", "sf-1w")
    else:
        best = max((n for n in SF_RUNS if n in tput), key=tput.get, default=None)
        if best:
            if kind == "text":
                out["vs_hf"] = ratio(best, "hf")
                out["vs_mds"] = ratio(best, "mds")
            else:
                out["vs_hf"] = ratio(best, "hf")
            out["vs_plain"] = ratio(best, "plain")
            out["best_shardfeed"] = best
        out["scale_2w"] = ratio("sf-2w", "sf-1w")
        out["scale_2t"] = ratio("sf-2t", "sf-1w")
        # the same ratio for the plain pass split over two processes, on the same machine
        out["plain_scale_2p"] = ratio("plain-2p", "plain")
    out["samples_per_s"] = {n: round(v, 1) for n, v in tput.items()}
    out["shards"] = {r.name: r.extra.get("shards") for r in results}
    out["peak_rss_mb"] = {r.name: round(r.peak_rss_bytes / 1e6) for r in results}
    return {k: v for k, v in out.items() if v is not None}


def run_kind(
    kind: str,
    workdir: Path,
    quick: bool,
    names: list[str] | None,
    timeout: float,
    drop: bool,
    docs: int | None = None,
) -> dict:
    """Generate (or reuse) the corpus, run the contenders of ``kind``, print the table and
    return the kind's summary block. ``docs``: documents per text file instead of the
    (quick or full) default."""
    started = time.perf_counter()
    if kind == "tfrecord":
        corpus = workdir / "tfrecord-corpus"
        info = make_tfrecord_corpus(corpus, TF_QUICK if quick else TF_FULL)
        info = {**info, "payload": info["bytes"], "bytes": {"tfrecord": info["bytes"]}}
    else:
        corpus = workdir / "text-corpus"
        info = make_text_corpus(corpus, docs or (QUICK_DOCS if quick else FULL_DOCS))
    samples = info["samples"]
    print(
        f"bench: corpus {corpus}: {samples:,} records in {FILES} files, "
        + ", ".join(f"{k} {v / 1e6:.1f} MB" for k, v in info["bytes"].items())
        + f" ({time.perf_counter() - started:.1f} s to make or reuse)",
        file=sys.stderr,
        flush=True,
    )
    default = {
        "text": TEXT_CONTENDERS,
        "parquet": PARQUET_CONTENDERS,
        "text-gz": GZ_CONTENDERS,
        "tfrecord": TFRECORD_CONTENDERS,
    }
    chosen = [n for n in (names or default[kind]) if n in default[kind]]
    out, logs = workdir / "outputs" / kind, workdir / "logs" / kind
    out.mkdir(parents=True, exist_ok=True)
    logs.mkdir(parents=True, exist_ok=True)
    can_drop = drop and bc.drop_caches()
    results = [
        run_one(name, cmd, warm, out / name, logs, samples, timeout, can_drop)
        for name, cmd, warm in plan_runs(kind, corpus, out, info, chosen)
    ]
    source = {"text": "jsonl", "parquet": "parquet", "text-gz": "jsonl"}.get(kind, kind)
    print()
    print(
        f"kind {kind}: {samples:,} records, "
        + ", ".join(f"{k} {v / 1e6:.1f} MB" for k, v in info["bytes"].items())
        + f", in {FILES} files; page cache "
        + ("dropped before each contender" if can_drop else "NOT dropped")
    )
    print(bc.fmt_table(results, samples, info["bytes"][source]))
    for r in results:
        if r.extra.get("note"):
            print(f"{r.name}: {r.extra['note']}")
    return summarise(kind, results, samples)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_peer":
        sys.exit(run_peer(sys.argv[2:]))
    sys.exit("run through scripts/bench_convert.sh --kind text|text-gz|parquet")
