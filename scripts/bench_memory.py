#!/usr/bin/env python3
"""Bounded-resources benchmark: ``shardfeed convert`` of one generated corpus at 1x and 4x its size.

Converting more data must not need more memory: every stage of ``ConvertFiles`` is meant to hold at
most a shard (and small per-file or per-bucket state), never the dataset. This benchmark checks that
from outside, on real conversions with the real CLI (``python -m shardfeed.cli.main convert``, the
default in-process Beam runner), and reports peak RSS and wall time per size.

Corpora (generated once per work directory, then reused)
--------------------------------------------------------
==========  =====================================================================================
image       an image folder of distinct JPEGs (``bench_convert.make_corpus``: 100 class dirs, 10-42
            KB each, mean ~26 KB), converted with ``--from imagefolder --validate header``
jsonl       JSONL text files of 2,000 documents each (``id``, ``text`` of a Zipf-vocabulary word
            stream with log-normal lengths, mean ~5.9 KB, ``source``, ``score``), ``--from jsonl``
tiny        JSONL files of 100,000 tiny records each (``id``, ``text`` of 10-40 letters, ~53 bytes a
            line): 1M records at 1x against 10M at 10x, whatever ``--scale`` says. With the
            in-process runner the convert process is the driver, so its peak is the driver's:
            it must stay <= 1 GB and <= 1.2x the 1M run (per-sample sizes are never held whole)
==========  =====================================================================================

The 4x corpus is written once; the 1x corpus is its first quarter, hard-linked (image: the first
``files`` images; jsonl: the first quarter of the files), so 1x is exactly a subset of 4x with the
same sizes and the same per-file layout. Both sizes use one target shard size: the 1x corpus's
payload over ``--shards-1x`` (by default the shard count the default 100 MB target would give at 1x:
3 in quick mode, about 86 MB each; 6 in full mode, about 104 MB), so 4x makes four times as many
shards of the same size. A shard is what a writer holds at once; with the default 100 MB target,
259 MB would make 3 shards of 86 MB and 1,033 MB 10 of 103 MB, and the larger shards alone would
show as memory growth. The table's ``MB/shard`` column shows the payload per shard at each size.

How each run is measured
------------------------
- Every run converts into a fresh DST (removed before and after), under ``bench_convert.py _measure``:
  a small process that makes itself a child subreaper, so every descendant (Beam's SDK workers with
  ``--direct_running_mode=multi_processing``, anything orphaned) is reaped by it.
  - ``peak RSS`` = ``getrusage(RUSAGE_CHILDREN).ru_maxrss`` of that tree: the largest single
    process's peak, kept by the kernel (exact; with the default in-process runner it is the convert
    process itself). **The headline uses it.**
  - ``tree RSS`` = the largest sum of RSS over the tree's live processes, polled from /proc every
    50 ms (an upper bound for multi-process runs; a spike under 50 ms can be missed).
- ``wall s`` is the whole command, interpreter start and imports included.
- Every output is checked with ``shardfeed inspect --json``: the sample count must match and a clean
  corpus must have no rejects.
- Each size runs ``--repeat`` (2) times, 1x then 4x, round by round; with ``--quick`` a second round
  runs only while it fits in ``--budget`` (170 s). Per size the table reports the **largest**
  peak RSS and the **median** wall time over its runs.
- The page cache is not dropped: the corpora were just written or read, so reads are warm at both
  sizes (RSS does not count the page cache).

The last line printed is a JSON object ``{"rss_growth": r, "time_growth": t, ...}``: peak RSS at 4x
over peak RSS at 1x, and wall time at 4x over wall time at 1x, for the worst corpus kind (the largest
of each ratio over the image and JSONL kinds run; tiny's when it runs alone), followed by the
per-kind figures (tiny's with ``met``). Targets: ``rss_growth <= 1.2``,
``time_growth <= 4.5``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_convert  # corpus generator, _measure, inspect-based verify

REPO = Path(__file__).resolve().parent.parent
JSONL_VERSION = 2
JSONL_DOCS_PER_FILE = 2_000
TINY_VERSION = 1
TINY_DOCS_PER_FILE = 100_000
TINY_SCALE = 10  # tiny is always 1M records against 10M, whatever --scale says
IMAGE = {"classes": 100, "min_kb": 10, "max_kb": 42}
# 1x sizes: image files / JSONL files (both >= 250 MB at 1x) / tiny JSONL files (1M records)
QUICK = {"image": 10_000, "jsonl": 22, "tiny": 10}
FULL = {"image": 24_000, "jsonl": 53, "tiny": 10}
KINDS = ("image", "jsonl", "tiny")
TARGETS = {"rss_growth": 1.2, "time_growth": 4.5}
TINY_RSS_LIMIT = 1e9  # the 10M-record run's peak RSS (the driver's, with the in-process runner)
DEFAULT_SHARD = 100e6  # convert's default --target-shard-size


# --------------------------------------------------------------------------------------------------
# Corpora
# --------------------------------------------------------------------------------------------------


def _word_pool(seed: int, size: int = 5_000) -> tuple[list[str], list[float]]:
    """A fixed vocabulary of ``size`` pseudo-words and Zipf (s = 1) probabilities over it."""
    import numpy as np

    rng = np.random.default_rng(seed)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    words = ["".join(rng.choice(letters, size=int(rng.integers(2, 10)))) for _ in range(size)]
    weights = 1.0 / np.arange(1, size + 1)
    return words, (weights / weights.sum()).tolist()


def write_jsonl_file(
    path: Path, seed: int, number: int, docs: int, words: list[str], p
) -> tuple[int, int]:
    """One JSONL file of ``docs`` documents, whose bytes depend only on (seed, number); returns
    its size and its payload (shardfeed's ``table_row_bytes`` of the rows it converts to)."""
    import numpy as np

    rng = np.random.default_rng([seed, number])
    lengths = np.clip(rng.lognormal(6.5, 0.7, size=docs).astype(np.int64), 5, 10_000)
    ids = rng.choice(len(words), size=int(lengths.sum()), p=p)
    vocab = np.array(words, dtype=object)
    stream = vocab[ids]
    ends = np.cumsum(lengths)
    lines = []
    payload = 0
    start = 0
    for i, end in enumerate(ends.tolist()):
        record = {
            "id": number * docs + i,
            "text": " ".join(stream[start:end]),
            "source": f"part-{number:05d}",
            "score": round((i % 997) / 997, 4),
        }
        lines.append(json.dumps(record))
        payload += len(record["text"].encode()) + len(record["source"]) + 16  # + id, score
        start = end
    data = ("\n".join(lines) + "\n").encode()
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(data)
    tmp.rename(path)
    return len(data), payload


def write_tiny_file(path: Path, seed: int, number: int, docs: int) -> tuple[int, int]:
    """One JSONL file of ``docs`` tiny records (``id`` and a ``text`` of 10-40 characters, ~45
    bytes a line), whose bytes depend only on (seed, number); returns its size and payload."""
    import numpy as np

    rng = np.random.default_rng([seed, number, 1])
    lengths = rng.integers(10, 41, size=docs)
    alphabet = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz     ", dtype=np.uint8)
    chars = alphabet[rng.integers(0, len(alphabet), size=int(lengths.sum()))].tobytes().decode()
    ends = np.cumsum(lengths).tolist()
    first = number * docs
    lines, start = [], 0
    for i, end in enumerate(ends):
        lines.append(f'{{"id": {first + i}, "text": "{chars[start:end]}"}}')
        start = end
    data = ("\n".join(lines) + "\n").encode()
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(data)
    tmp.rename(path)
    return len(data), int(lengths.sum()) + 8 * docs  # text bytes + the int64 id


def make_jsonl_corpus(root: Path, files: int, seed: int, tiny: bool = False) -> dict:
    """``files`` JSONL files of JSONL_DOCS_PER_FILE documents, or with ``tiny`` of
    TINY_DOCS_PER_FILE tiny records (reused when already made)."""
    docs = TINY_DOCS_PER_FILE if tiny else JSONL_DOCS_PER_FILE
    version = TINY_VERSION if tiny else JSONL_VERSION
    params = {"version": version, "files": files, "docs": docs, "seed": seed, "tiny": tiny}
    stamp = root / ".bench-corpus.json"
    if stamp.exists():
        saved = json.loads(stamp.read_text())
        if saved.get("params") == params:
            return saved
        shutil.rmtree(root)
    root.mkdir(parents=True, exist_ok=True)
    paths = [root / f"part-{n:05d}.jsonl" for n in range(files)]
    common = [[seed] * files, range(files), [docs] * files]
    if not tiny:
        words, p = _word_pool(seed)
        common += [[words] * files, [p] * files]
    with ProcessPoolExecutor(max_workers=os.cpu_count() or 1) as pool:  # ~0.3 s per file
        write = write_tiny_file if tiny else write_jsonl_file
        sizes = list(pool.map(write, paths, *common, chunksize=8))
    info = {
        "params": params,
        "files": files,
        "samples": files * docs,
        "bytes": sum(size for size, _ in sizes),
        "payload": [payload for _, payload in sizes],  # per file
    }
    stamp.write_text(json.dumps(info))
    return info


def link_subset(big: Path, small: Path, keep) -> tuple[int, int]:
    """Hard-link the files of ``big`` that ``keep(relative path)`` accepts into ``small``."""
    if small.exists():
        shutil.rmtree(small)
    count = size = 0
    for dirpath, _, names in os.walk(big):
        for name in names:
            if name.startswith("."):
                continue
            src = Path(dirpath) / name
            rel = src.relative_to(big)
            if not keep(rel):
                continue
            dst = small / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            os.link(src, dst)
            count += 1
            size += src.stat().st_size
    return count, size


@dataclass
class Corpus:
    kind: str
    scale: int  # 1 or the --scale factor
    root: Path
    samples: int
    bytes: int
    payload: int  # estimated payload bytes (picks a shard size that divides the 1x corpus)


def make_corpora(kind: str, base: int, scale: int, workdir: Path, seed: int) -> list[Corpus]:
    """The ``scale``x corpus (generated or reused) and its 1x subset (hard links)."""
    big, small = workdir / f"{kind}-x{scale}", workdir / f"{kind}-x1"
    if kind == "image":
        info = bench_convert.make_corpus(
            big, base * scale, IMAGE["classes"], IMAGE["min_kb"], IMAGE["max_kb"], seed
        )
        big_samples = info["files"]
        # img_NNNNNN.jpg with NNNNNN < base: the first `base` images, in their class dirs
        keep = lambda rel: int(rel.stem.split("_")[1]) < base  # noqa: E731
        count, size = link_subset(big, small, keep)
        small_samples = count
        # imagefolder's payload per row: image bytes + UTF-8 path + the int64 label
        overhead = sum(len(str(rel)) + 8 for rel in _relpaths(small))
        payloads = (size + overhead, info["bytes"] + overhead * scale)
    else:
        info = make_jsonl_corpus(big, base * scale, seed, tiny=kind == "tiny")
        big_samples = info["samples"]
        count, size = link_subset(big, small, lambda rel: int(rel.stem.split("-")[1]) < base)
        small_samples = count * info["params"]["docs"]
        payloads = (sum(info["payload"][:base]), sum(info["payload"]))
    return [
        Corpus(kind, 1, small, small_samples, size, payloads[0]),
        Corpus(kind, scale, big, big_samples, info["bytes"], payloads[1]),
    ]


def _relpaths(root: Path) -> list[Path]:
    return [
        Path(d).relative_to(root) / n for d, _, names in os.walk(root) for n in names if n[0] != "."
    ]


# --------------------------------------------------------------------------------------------------
# Runs
# --------------------------------------------------------------------------------------------------


@dataclass
class Run:
    wall_s: float
    cpu_s: float
    peak_rss_bytes: int
    tree_rss_bytes: int
    shards: int
    payload_bytes: int


@dataclass
class Size:
    corpus: Corpus
    runs: list[Run] = field(default_factory=list)

    @property
    def peak_rss(self) -> int:
        return max(r.peak_rss_bytes for r in self.runs)

    @property
    def tree_rss(self) -> int:
        return max(r.tree_rss_bytes for r in self.runs)

    @property
    def wall(self) -> float:
        return statistics.median(r.wall_s for r in self.runs)

    @property
    def cpu(self) -> float:
        return statistics.median(r.cpu_s for r in self.runs)


def convert_cmd(corpus: Corpus, dst: Path, target: int, extra: list[str]) -> list[str]:
    cmd = [sys.executable, "-m", "shardfeed.cli.main", "convert", str(corpus.root), str(dst)]
    if corpus.kind == "image":
        cmd += ["--from", "imagefolder", "--validate", "header"]
    else:
        cmd += ["--from", "jsonl"]
    return [*cmd, "--target-shard-size", str(target), "--json", *extra]


def run_once(
    corpus: Corpus, work: Path, target: int, extra: list[str], timeout: float, tag: str
) -> Run:
    """One measured conversion into a fresh DST, checked with ``shardfeed inspect``."""
    dst = work / "dst"
    shutil.rmtree(dst, ignore_errors=True)
    logs = work / "logs"
    logs.mkdir(exist_ok=True)
    result, out, err = (logs / f"{tag}.{ext}" for ext in ("json", "out", "err"))
    cmd = convert_cmd(corpus, dst, target, extra)
    measurer = [sys.executable, bench_convert.__file__, "_measure", str(result), str(out), str(err)]
    print(f"bench: {tag}: {' '.join(cmd)}", file=sys.stderr, flush=True)
    try:
        subprocess.run([*measurer, "--", *cmd], check=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise SystemExit(f"bench: {tag} took longer than {timeout:.0f} s; logs in {logs}") from None
    m = json.loads(result.read_text())
    if m["rc"] != 0:
        tail = err.read_text(errors="replace")[-4000:]
        raise SystemExit(f"bench: {tag} exited {m['rc']}:\n{tail}")
    found = bench_convert.inspect_json(dst)
    if found["num_samples"] != corpus.samples or found["rejects"]["total"]:
        raise SystemExit(
            f"bench: {tag} wrote {found['num_samples']} samples with {found['rejects']} rejects, "
            f"expected {corpus.samples} and none"
        )
    shutil.rmtree(dst, ignore_errors=True)
    return Run(
        m["wall_s"],
        m["cpu_s"],
        m["peak_rss_bytes"],
        m["tree_rss_bytes"],
        found["num_shards"],
        found["payload_bytes"],
    )


def fmt_table(sizes: list[Size]) -> str:
    head = (
        "corpus",
        "size",
        "samples",
        "input MB",
        "shards",
        "MB/shard",
        "runs",
        "wall s",
        "cpu s",
        "peak RSS MB",
        "tree RSS MB",
        "wall s (each)",
        "peak RSS MB (each)",
    )
    rows = [head]
    for s in sizes:
        c = s.corpus
        rows.append(
            (
                c.kind,
                f"{c.scale}x",
                f"{c.samples:,}",
                f"{c.bytes / 1e6:,.0f}",
                str(s.runs[0].shards),
                f"{s.runs[0].payload_bytes / s.runs[0].shards / 1e6:.1f}",
                str(len(s.runs)),
                f"{s.wall:.1f}",
                f"{s.cpu:.1f}",
                f"{s.peak_rss / 1e6:.0f}",
                f"{s.tree_rss / 1e6:.0f}",
                " ".join(f"{r.wall_s:.1f}" for r in s.runs),
                " ".join(f"{r.peak_rss_bytes / 1e6:.0f}" for r in s.runs),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = []
    for n, row in enumerate(rows):
        lines.append(
            "  ".join(
                [row[0].ljust(widths[0])]
                + [c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True)]
            )
        )
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=(
            "Convert one generated corpus (image folder and/or JSONL) at 1x and 4x its size with "
            "`shardfeed convert` and report peak RSS and wall time per size. Prints a table, then as "
            'the last line a JSON object {"rss_growth": r, "time_growth": t, ...}. '
            "Run it through scripts/bench_memory.sh, which sets up .venv."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"1x = {QUICK['image']:,} images (~260 MB) / {QUICK['jsonl']} JSONL files (~260 MB), "
        "a second run per size only within --budget (170 s), under 3 minutes; default (full): "
        f"1x = {FULL['image']:,} images / {FULL['jsonl']} JSONL files (~620 MB each), twice each",
    )
    parser.add_argument(
        "--kinds", default=",".join(KINDS), help="comma-separated subset of: " + ", ".join(KINDS)
    )
    parser.add_argument("--scale", type=int, default=4, help="the larger size, as a multiple of 1x")
    parser.add_argument(
        "--repeat",
        type=int,
        help="runs per size and kind (default 2; with --quick, later runs only within --budget)",
    )
    parser.add_argument("--image-files", type=int, help="1x image count (overrides the preset)")
    parser.add_argument(
        "--jsonl-files", type=int, help="1x JSONL file count (overrides the preset)"
    )
    parser.add_argument(
        "--shards-1x",
        type=int,
        help="the target shard size is the 1x corpus's payload over this (so 1x makes this many "
        "shards and 4x four times as many, all of one size); default: the count the default "
        "100 MB target gives at 1x",
    )
    parser.add_argument(
        "--budget",
        type=float,
        help="seconds: a repetition after the first starts only if the previous one's duration "
        "still fits (default 170 with --quick, else none)",
    )
    parser.add_argument("--seed", type=int, default=0, help="corpus seed")
    parser.add_argument(
        "--workdir",
        type=Path,
        help="where corpora and outputs go (default: a new directory under out/bench, removed at the "
        "end unless --keep); corpora already there, made with the same parameters, are reused",
    )
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument("--timeout", type=float, default=900, help="seconds allowed per run")
    parser.add_argument(
        "convert_args",
        nargs="*",
        help="extra flags for every convert after `--`, e.g. -- "
        "--direct_running_mode=multi_processing --direct_num_workers=2",
    )
    args = parser.parse_args(argv)

    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    if set(kinds) - set(KINDS) or not kinds:
        parser.error(f"--kinds takes a subset of {', '.join(KINDS)}")
    if args.scale < 2:
        parser.error("--scale must be at least 2")
    preset = dict(QUICK if args.quick else FULL)
    if args.image_files:
        preset["image"] = args.image_files
    if args.jsonl_files:
        preset["jsonl"] = args.jsonl_files
    repeats = args.repeat or 2
    budget = args.budget if args.budget is not None else (170.0 if args.quick else None)

    if args.workdir:
        workdir, temporary = args.workdir.resolve(), False
        workdir.mkdir(parents=True, exist_ok=True)
    else:
        (REPO / "out" / "bench").mkdir(parents=True, exist_ok=True)
        workdir = Path(tempfile.mkdtemp(prefix="bench-memory-", dir=REPO / "out" / "bench"))
        temporary = True

    started = time.perf_counter()
    load_before = os.getloadavg()
    results: dict[str, list[Size]] = {}
    targets: dict[str, int] = {}
    shards_1x: dict[str, int] = {}
    generate_s = 0.0
    try:
        for kind in kinds:  # every corpus first, then the runs round by round
            t0 = time.perf_counter()
            scale = TINY_SCALE if kind == "tiny" else args.scale
            corpora = make_corpora(kind, preset[kind], scale, workdir / "corpora", args.seed)
            generate_s += time.perf_counter() - t0
            sizes = [Size(c) for c in corpora]
            print(
                f"bench: {kind}: "
                + ", ".join(
                    f"{c.scale}x {c.samples:,} samples {c.bytes / 1e6:,.0f} MB" for c in corpora
                )
                + f" ({time.perf_counter() - t0:.1f} s to make or reuse)",
                file=sys.stderr,
                flush=True,
            )
            # ceil: the 1x corpus makes exactly that many shards
            shards_1x[kind] = args.shards_1x or max(1, round(corpora[0].payload / DEFAULT_SHARD))
            targets[kind] = -(-corpora[0].payload // shards_1x[kind])
            results[kind] = sizes
        last: dict[str, float] = {}
        for rep in range(repeats):
            for kind, sizes in results.items():
                elapsed = time.perf_counter() - started
                if rep and budget is not None and elapsed + last[kind] > budget:
                    print(f"bench: {kind} run {rep + 1} skipped: over the budget", file=sys.stderr)
                    continue
                t0 = time.perf_counter()
                for size in sizes:
                    tag = f"{kind}-x{size.corpus.scale}-run{rep + 1}"
                    run = run_once(
                        size.corpus, workdir, targets[kind], args.convert_args, args.timeout, tag
                    )
                    size.runs.append(run)
                last[kind] = time.perf_counter() - t0
    finally:
        if temporary and not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    load_after = os.getloadavg()
    seconds = time.perf_counter() - started

    per_kind: dict[str, dict] = {}
    for kind, (one, big) in results.items():
        per_kind[kind] = {
            "rss_growth": round(big.peak_rss / one.peak_rss, 3),
            "time_growth": round(big.wall / one.wall, 3),
            "data_growth": round(big.corpus.bytes / one.corpus.bytes, 3),
            "tree_rss_growth": round(big.tree_rss / one.tree_rss, 3),
            "peak_rss_mb": [round(one.peak_rss / 1e6, 1), round(big.peak_rss / 1e6, 1)],
            "wall_s": [round(one.wall, 2), round(big.wall, 2)],
            "samples": [one.corpus.samples, big.corpus.samples],
            "input_mb": [round(one.corpus.bytes / 1e6, 1), round(big.corpus.bytes / 1e6, 1)],
            "runs": len(one.runs),
            "shards": [one.runs[0].shards, big.runs[0].shards],
            "target_shard_bytes": targets[kind],
            "rss_per_extra_sample_bytes": round(
                (big.peak_rss - one.peak_rss) / (big.corpus.samples - one.corpus.samples), 1
            ),
        }
    # the headline ratios are over the kinds run at --scale; tiny (always 10x) has its own line
    scaled = [v for k, v in per_kind.items() if k != "tiny"] or list(per_kind.values())
    rss_growth = max(v["rss_growth"] for v in scaled)
    time_growth = max(v["time_growth"] for v in scaled)

    print()
    print(
        f"shardfeed convert at 1x and {args.scale}x, target shard size = 1x payload / 1x shards ("
        + ", ".join(f"{k} {t / 1e6:.1f} MB = /{shards_1x[k]}" for k, t in targets.items())
        + "), in-process runner"
        + (f" + {' '.join(args.convert_args)}" if args.convert_args else "")
        + f"; {os.cpu_count()} cores; Python {sys.version.split()[0]}"
    )
    print(
        "peak RSS = largest single-process peak of the convert's process tree (getrusage "
        "RUSAGE_CHILDREN under a subreaper), the largest over the runs; tree RSS = largest sampled "
        "sum over the tree (50 ms); wall = whole command, median over the runs; page cache warm"
    )
    print(
        f"load average (1, 5, 15 min): {load_before[0]:.2f} {load_before[1]:.2f} {load_before[2]:.2f} "
        f"before, {load_after[0]:.2f} {load_after[1]:.2f} {load_after[2]:.2f} after; "
        f"{seconds:.0f} s in all ({generate_s:.0f} s making corpora)"
    )
    print()
    print(fmt_table([s for sizes in results.values() for s in sizes]))
    print()
    for kind, v in per_kind.items():
        print(
            f"{kind}: rss_growth {v['rss_growth']:.3f}, time_growth {v['time_growth']:.3f} "
            f"for {v['data_growth']:.2f}x the data ({v['rss_per_extra_sample_bytes']:+.0f} B of "
            "peak RSS per extra sample)"
        )
    verdict = []
    headline = (
        []
        if set(per_kind) == {"tiny"}
        else [("rss_growth", rss_growth), ("time_growth", time_growth)]
    )
    for name, value in headline:  # the 4x targets; tiny (10x) has its own below
        met = "met" if value <= TARGETS[name] else "MISSED"
        verdict.append(f"{name} {value:.3f} <= {TARGETS[name]} {met}")
    if "tiny" in per_kind:  # issue 21: the driver's memory is O(shards), not O(samples)
        tiny = per_kind["tiny"]
        tiny_mb = tiny["peak_rss_mb"][1]
        met = tiny_mb <= TINY_RSS_LIMIT / 1e6 and tiny["rss_growth"] <= TARGETS["rss_growth"]
        tiny["met"] = met
        verdict.append(
            f"tiny {tiny['samples'][1]:,} records: peak RSS {tiny_mb:.0f} MB <= "
            f"{TINY_RSS_LIMIT / 1e6:.0f} MB and {tiny['rss_growth']:.3f} <= "
            f"{TARGETS['rss_growth']}x the {tiny['samples'][0]:,}-record run "
            f"{'met' if met else 'MISSED'}"
        )
    print("targets (worst kind): " + "; ".join(verdict))
    summary = {
        "rss_growth": rss_growth,
        "time_growth": time_growth,
        "kinds": per_kind,
        "scale": args.scale,
        "quick": args.quick,
        "convert_args": args.convert_args,
        "rss": "max over runs of ru_maxrss (RUSAGE_CHILDREN)",
        "time": "median wall over runs",
        "seconds": round(seconds, 1),
        "generate_seconds": round(generate_s, 1),
        "cpus": os.cpu_count(),
        "loadavg": [round(load_before[0], 2), round(load_after[0], 2)],
    }
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
