#!/usr/bin/env python3
"""Conversion benchmark: ``shardfeed convert`` against the peer shard writers and a plain copy.

One deterministic image-folder corpus (``class_NNN/img_NNNNNN.jpg``, every file a valid, distinct JPEG)
is generated once and converted by each contender, side by side on this machine:

==================  ===========================================================================
sf-header-1w        ``shardfeed convert --validate header`` on the in-process runner, one thread
sf-header-2t        the same on two threads (what ``convert`` does by default on 2 cores)
sf-header-2w        the same with ``--direct_running_mode=multi_processing --direct_num_workers=2``
sf-full-1w          ``shardfeed convert`` with the default ``--validate full`` (decodes every image), one thread
wds                 WebDataset ``ShardWriter``: tars of (jpg bytes, cls) at the same shard size
mds                 mosaicml-streaming ``MDSWriter``: {image: bytes, label: int}, no compression
cp                  ``cp -r`` of the corpus
==================  ===========================================================================

All contenders get the same target shard size. The peers neither decode nor validate images, so the
headline ratios use shardfeed's ``--validate header`` runs (like for like); the ``--validate full`` run
is reported beside them with its decode cost.

How each contender is measured
------------------------------
- Before each run: ``sync`` and ``echo 3 > /proc/sys/vm/drop_caches`` (when allowed: the output says
  whether caches were dropped), then the contender's Python imports are warmed in a throw-away
  process, so every contender reads the *corpus* cold but its *code* warm.
- Each run is a fresh process tree under a small measuring process (``bench_convert.py _measure``) that
  makes itself a child subreaper (``prctl(PR_SET_CHILD_SUBREAPER)``): every descendant, including
  Beam's multi_processing SDK workers and anything orphaned, is reparented to it and reaped by it, so
  ``getrusage(RUSAGE_CHILDREN)`` covers the whole tree.
  - ``peak RSS`` = ``ru_maxrss`` of the tree: the largest single process's peak (exact, kernel-kept).
  - ``tree RSS`` = the largest *sum* of RSS over all live processes of the tree, sampled from /proc every
    50 ms (what multi-process runners really hold; shared pages count once per process, so it is an
    upper bound, and a spike shorter than 50 ms can be missed).
  - ``cpu s`` = user + system CPU time of the whole tree.
- ``wall s`` is the whole command, interpreter start and imports included (what a user waits for);
  ``work s`` excludes them (shardfeed's own summary ``seconds``; the peers time from after their imports).
- ``sync s`` is a ``sync`` run right after the contender exits: the time to make its output durable.
  shardfeed fsyncs every file it publishes; the peers and cp leave dirty pages behind.
- Every output is checked (sample counts: ``shardfeed inspect --json``, tar members, MDS ``index.json``,
  copied files), so no contender wins by writing nothing; a failed check fails the benchmark.

``--kind`` picks the corpus: ``image`` (this file), ``text``, ``text-gz`` and ``parquet``
(``bench_convert_text.py``), or ``all`` of them in turn. The last line printed is one JSON object
with a block per kind run: ``{"image": {"vs_best_peer": x, "vs_copy": y, "samples_per_s": z, ...},
"text": {"vs_hf": ..., "vs_plain": ..., "scale_2w": ...}, ...}``. In the image block: the best shardfeed ``--validate header`` throughput (samples/s on wall time) over the best peer's
(WebDataset, MDS), over cp's, and that shardfeed throughput itself.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CORPUS_VERSION = 1
PR_SET_CHILD_SUBREAPER = 36
SAMPLE_INTERVAL_S = 0.05

FULL = {"files": 24_000, "classes": 100, "min_kb": 10, "max_kb": 40, "shard": "100MB"}
QUICK = {"files": 3_000, "classes": 100, "min_kb": 10, "max_kb": 30, "shard": "10MB"}

ALL_CONTENDERS = ("cp", "wds", "mds", "sf-header-1w", "sf-header-2t", "sf-header-2w", "sf-full-1w")
PEERS = ("wds", "mds")
SF_HEADER = ("sf-header-1w", "sf-header-2t", "sf-header-2w")
KINDS = ("image", "text", "text-gz", "parquet", "tfrecord", "lerobot")


# --------------------------------------------------------------------------------------------------
# Corpus
# --------------------------------------------------------------------------------------------------


def _texture(rng, width: int, height: int, noise: float):
    """A random-ish RGB texture: smooth colour blobs plus grain (so JPEG sizes vary with area)."""
    import numpy as np
    from PIL import Image

    cells = rng.integers(
        0, 256, size=(max(2, height // 16), max(2, width // 16), 3), dtype=np.uint8
    )
    base = np.asarray(
        Image.fromarray(cells).resize((width, height), Image.BILINEAR), dtype=np.float32
    )
    grain = rng.normal(0.0, noise, size=(height, width, 3)).astype(np.float32)
    return Image.fromarray(np.clip(base + grain, 0, 255).astype(np.uint8))


def _encode(image, quality: int) -> bytes:
    import io

    buf = io.BytesIO()
    image.save(buf, format="JPEG", quality=quality)
    return buf.getvalue()


def make_pool(seed: int, count: int, min_bytes: int, max_bytes: int) -> list[bytes]:
    """``count`` distinct JPEGs whose sizes spread evenly over [min_bytes, max_bytes]."""
    import numpy as np

    rng = np.random.default_rng(seed)
    pool: list[bytes] = []
    bytes_per_pixel = 0.4  # running estimate, so most slots hit their size on the first try
    for slot in range(count):
        target = min_bytes + (max_bytes - min_bytes) * (slot + 0.5) / count
        quality = int(rng.integers(70, 96))
        noise = float(rng.uniform(6.0, 24.0))
        aspect = float(rng.uniform(0.6, 1.6))
        side = (target / bytes_per_pixel) ** 0.5
        data = b""
        for _ in range(6):  # area ~ bytes: a few proportional corrections converge
            width = max(16, round(side * aspect**0.5))
            height = max(16, round(side / aspect**0.5))
            data = _encode(_texture(rng, width, height, noise), quality)
            bytes_per_pixel = 0.8 * bytes_per_pixel + 0.2 * len(data) / (width * height)
            if abs(len(data) - target) <= 0.08 * target:
                break
            side *= (target / len(data)) ** 0.5
        pool.append(data)
    return pool


def _with_comment(jpeg: bytes, text: bytes) -> bytes:
    """Insert a COM segment right after SOI: still a valid JPEG, and its bytes are unique."""
    assert jpeg[:2] == b"\xff\xd8"
    return jpeg[:2] + b"\xff\xfe" + (len(text) + 2).to_bytes(2, "big") + text + jpeg[2:]


def make_corpus(root: Path, files: int, classes: int, min_kb: int, max_kb: int, seed: int) -> dict:
    """Write the corpus (reused when ``root`` already holds one made with the same parameters)."""
    import numpy as np

    params = {
        "version": CORPUS_VERSION,
        "files": files,
        "classes": classes,
        "min_kb": min_kb,
        "max_kb": max_kb,
        "seed": seed,
    }
    stamp = root / ".bench-corpus.json"
    if stamp.exists():
        saved = json.loads(stamp.read_text())
        if saved.get("params") == params:
            return saved
        shutil.rmtree(root)
    root.mkdir(parents=True, exist_ok=True)
    pool = make_pool(seed, 256, min_kb * 1000, max_kb * 1000)
    rng = np.random.default_rng(seed + 1)
    picks = rng.integers(0, len(pool), size=files)
    for c in range(classes):
        (root / f"class_{c:03d}").mkdir(exist_ok=True)
    total = 0
    for i in range(files):
        data = _with_comment(pool[picks[i]], f"shardfeed-bench {seed} {i}".encode())
        with open(root / f"class_{i % classes:03d}" / f"img_{i:06d}.jpg", "wb") as f:
            f.write(data)
        total += len(data)
    info = {"params": params, "files": files, "bytes": total}
    stamp.write_text(json.dumps(info))
    return info


def list_corpus(root: Path) -> list[tuple[str, int]]:
    """(path, label) in source order: class directories sorted by name, files sorted within."""
    out = []
    classes = sorted(d.name for d in root.iterdir() if d.is_dir() and not d.name.startswith("."))
    for label, name in enumerate(classes):
        for entry in sorted(os.listdir(root / name)):
            if entry.lower().endswith((".jpg", ".jpeg")):
                out.append((str(root / name / entry), label))
    return out


# --------------------------------------------------------------------------------------------------
# Peer writers (run as `bench_convert.py _wds|_mds SRC DST SHARD_BYTES` inside a measured process)
# --------------------------------------------------------------------------------------------------


def peer_wds(src: str, dst: str, shard_bytes: int) -> dict:
    import webdataset as wds

    started = time.perf_counter()
    items = list_corpus(Path(src))
    os.makedirs(dst, exist_ok=True)
    # ShardWriter's maxsize counts bytes written to the current tar; maxcount is set out of the way.
    with wds.ShardWriter(
        os.path.join(dst, "shard-%06d.tar"), maxsize=shard_bytes, maxcount=10**9, verbose=0
    ) as sink:
        for path, label in items:
            with open(path, "rb") as f:
                data = f.read()
            stem = os.path.splitext(os.path.basename(path))[0]
            sink.write({"__key__": f"{label:03d}_{stem}", "jpg": data, "cls": label})
    return {"work_s": time.perf_counter() - started, "samples": len(items)}


def import_mds_writer() -> tuple[type, str | None]:
    """``streaming.MDSWriter``, and a note when torchvision had to be stubbed out to get it.

    ``import streaming`` imports ``streaming.vision``, which imports torchvision. PyPI's torchvision
    wheels link against CUDA torch libraries and fail to load beside a CPU-only torch (as on this
    machine). The writer needs neither, so a broken torchvision gets an empty ``streaming.vision``.
    """
    note = None
    try:
        import torchvision  # noqa: F401
    except Exception as err:
        import types

        for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[name]
        sys.modules["streaming.vision"] = types.ModuleType("streaming.vision")
        note = f"torchvision unusable ({type(err).__name__}: {err}); streaming.vision stubbed out"
    from streaming import MDSWriter

    return MDSWriter, note


def peer_mds(src: str, dst: str, shard_bytes: int) -> dict:
    MDSWriter, note = import_mds_writer()

    started = time.perf_counter()
    items = list_corpus(Path(src))
    with MDSWriter(
        out=dst,
        columns={"image": "bytes", "label": "int"},
        size_limit=shard_bytes,
        compression=None,
        progress_bar=False,
    ) as sink:
        for path, label in items:
            with open(path, "rb") as f:
                data = f.read()
            sink.write({"image": data, "label": label})
    return {"work_s": time.perf_counter() - started, "samples": len(items), "note": note}


# --------------------------------------------------------------------------------------------------
# The measuring process (`bench_convert.py _measure RESULT_JSON STDOUT STDERR -- CMD...`)
# --------------------------------------------------------------------------------------------------


def _children(pid: int) -> list[int]:
    kids: list[int] = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return kids
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                kids.extend(int(k) for k in f.read().split())
        except OSError:
            pass
    return kids


def _tree_rss_bytes(root: int) -> int:
    page = os.sysconf("SC_PAGE_SIZE")
    total, todo, seen = 0, _children(root), set()
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        try:
            with open(f"/proc/{pid}/statm") as f:
                total += int(f.read().split()[1]) * page
        except (OSError, IndexError, ValueError):
            continue
        todo.extend(_children(pid))
    return total


def measure(result_path: str, stdout_path: str, stderr_path: str, cmd: list[str]) -> int:
    subreaper = False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        subreaper = libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        pass
    peak_tree = 0
    stop = threading.Event()

    def sample() -> None:
        nonlocal peak_tree
        me = os.getpid()
        while not stop.is_set():
            peak_tree = max(peak_tree, _tree_rss_bytes(me))
            stop.wait(SAMPLE_INTERVAL_S)

    sampler = threading.Thread(target=sample, daemon=True)
    with open(stdout_path, "wb") as out, open(stderr_path, "wb") as err:
        started = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err)
        sampler.start()
        rc = proc.wait()
        wall = time.perf_counter() - started
    # Reap whatever the contender left behind (reparented to us as subreaper), so it is counted.
    stragglers = 0
    deadline = time.monotonic() + 15
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid:
            continue
        if time.monotonic() > deadline:
            for kid in _children(os.getpid()):
                stragglers += 1
                with contextlib.suppress(OSError):
                    os.kill(kid, signal.SIGKILL)
            deadline = time.monotonic() + 15
        time.sleep(0.05)
    stop.set()
    sampler.join()
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    Path(result_path).write_text(
        json.dumps(
            {
                "rc": rc,
                "wall_s": wall,
                "cpu_s": usage.ru_utime + usage.ru_stime,
                "peak_rss_bytes": usage.ru_maxrss * 1024,  # Linux reports KiB
                "tree_rss_bytes": peak_tree,
                "subreaper": subreaper,
                "stragglers_killed": stragglers,
            }
        )
    )
    return 0


# --------------------------------------------------------------------------------------------------
# Driver
# --------------------------------------------------------------------------------------------------


@dataclass
class Result:
    name: str
    wall_s: float
    work_s: float | None
    sync_s: float
    cpu_s: float
    peak_rss_bytes: int
    tree_rss_bytes: int
    out_bytes: int
    samples: int
    extra: dict = field(default_factory=dict)

    @classmethod
    def of(
        cls,
        name: str,
        m: dict,
        work: float | None,
        sync_s: float,
        dst: Path,
        samples: int,
        extra: dict,
    ) -> Result:
        """A contender's result from its measurement ``m`` (``_measure``) and its output ``dst``."""
        _, out_bytes = tree_bytes(dst)
        return cls(
            name,
            m["wall_s"],
            work,
            sync_s,
            m["cpu_s"],
            m["peak_rss_bytes"],
            m["tree_rss_bytes"],
            out_bytes,
            samples,
            extra,
        )


def parse_size(text: str) -> int:
    units = {
        "": 1,
        "B": 1,
        "KB": 10**3,
        "MB": 10**6,
        "GB": 10**9,
        "KIB": 2**10,
        "MIB": 2**20,
        "GIB": 2**30,
    }
    s = text.strip().upper().replace(" ", "")
    num = s.rstrip("KMGIB")
    return int(float(num) * units[s[len(num) :]])


def drop_caches() -> bool:
    subprocess.run(["sync"], check=False)
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def tree_bytes(root: Path) -> tuple[int, int]:
    files = size = 0
    for dirpath, _, names in os.walk(root):
        for name in names:
            files += 1
            size += os.path.getsize(os.path.join(dirpath, name))
    return files, size


def contender_cmd(name: str, src: Path, dst: Path, shard: str) -> tuple[list[str], str]:
    """The command, and the Python imports to warm before it (empty for cp)."""
    py = sys.executable
    me = str(Path(__file__).resolve())
    sf = [
        py,
        "-m",
        "shardfeed.cli.main",
        "convert",
        str(src),
        str(dst),
        "--from",
        "imagefolder",
        "--target-shard-size",
        shard,
        "--json",
    ]
    warm_sf = "import apache_beam, shardfeed.cli.main, shardfeed.pipelines.driver"
    if name == "cp":
        return ["cp", "-r", str(src), str(dst)], ""
    if name == "wds":
        return [py, me, "_wds", str(src), str(dst), str(parse_size(shard))], "import webdataset"
    if name == "mds":
        warm_mds = f"import sys; sys.path.insert(0, {str(Path(me).parent)!r}); import bench_convert; bench_convert.import_mds_writer()"
        return [py, me, "_mds", str(src), str(dst), str(parse_size(shard))], warm_mds
    one = "--direct_num_workers=1"
    if name == "sf-header-1w":
        return [*sf, "--validate", "header", one], warm_sf
    if name == "sf-header-2t":
        threads = ["--direct_running_mode=multi_threading", "--direct_num_workers=2"]
        return [*sf, "--validate", "header", *threads], warm_sf
    if name == "sf-header-2w":
        return (
            [
                *sf,
                "--validate",
                "header",
                "--direct_running_mode=multi_processing",
                "--direct_num_workers=2",
            ],
            warm_sf + ", apache_beam.runners.worker.sdk_worker_main",
        )
    if name == "sf-full-1w":
        return [*sf, one], warm_sf
    raise ValueError(name)


def last_json(text: str) -> dict:
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                continue
    start = text.find("{")  # a pretty-printed object
    return json.loads(text[start:]) if start >= 0 else {}


def inspect_json(dst: Path) -> dict:
    """``shardfeed inspect DST --json``, parsed; a failed inspect ends the benchmark."""
    proc = subprocess.run(
        [sys.executable, "-m", "shardfeed.cli.main", "inspect", str(dst), "--json"],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise SystemExit(f"bench: shardfeed inspect {dst} failed:\n{proc.stderr}")
    return json.loads(proc.stdout)


def verify(name: str, dst: Path, expected: int, stdout: str) -> tuple[int, dict]:
    """Samples actually present in ``dst`` (and anything worth reporting)."""
    if name == "cp":
        files, _ = tree_bytes(dst)
        return files - 1, {}  # minus the corpus stamp file
    if name == "wds":
        import tarfile

        keys = set()
        for tar in sorted(dst.glob("*.tar")):
            with tarfile.open(tar) as t:
                members = t.getnames()
            jpgs = {m.rsplit(".", 1)[0] for m in members if m.endswith(".jpg")}
            clss = {m.rsplit(".", 1)[0] for m in members if m.endswith(".cls")}
            if jpgs != clss:
                raise SystemExit(f"bench: {tar} has jpg and cls members that do not pair up")
            keys |= jpgs
        return len(keys), {"shards": len(list(dst.glob("*.tar")))}
    if name == "mds":
        index = json.loads((dst / "index.json").read_text())
        shards = index["shards"]
        for s in shards:
            if not (dst / s["raw_data"]["basename"]).is_file():
                raise SystemExit(f"bench: MDS shard {s['raw_data']['basename']} is missing")
        return sum(s["samples"] for s in shards), {"shards": len(shards)}
    # shardfeed: what the published dataset says, read back by `shardfeed inspect --json`.
    summary = last_json(stdout)
    inspected = inspect_json(dst)
    if inspected["rejects"]["total"]:
        raise SystemExit(f"bench: {name} rejected {inspected['rejects']} of a clean corpus")
    return inspected["num_samples"], {
        "shards": inspected["num_shards"],
        "summary_seconds": summary.get("seconds"),
        "payload_max_over_mean": inspected["balance"]["payload_bytes_max_over_mean"],
    }


def measured_run(
    name: str, cmd: list[str], warm: str, logs: Path, timeout: float, can_drop: bool
) -> tuple[dict, str, float]:
    """Run ``cmd`` under ``_measure`` (caches dropped first when allowed, its imports warmed):
    the measurement, its stdout and the seconds a ``sync`` took after it. Exits on failure."""
    if can_drop:
        drop_caches()
    if warm:  # code warm, corpus cold
        subprocess.run([sys.executable, "-c", warm], check=True, capture_output=True)
    result_json, out_log, err_log = (logs / f"{name}.{ext}" for ext in ("json", "out", "err"))
    measurer = [sys.executable, str(Path(__file__).resolve()), "_measure", str(result_json)]
    measurer += [str(out_log), str(err_log), "--", *cmd]
    print(f"bench: running {name}: {' '.join(cmd)}", file=sys.stderr, flush=True)
    try:
        subprocess.run(measurer, check=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise SystemExit(
            f"bench: {name} took longer than {timeout:.0f} s; logs in {logs}"
        ) from None
    started = time.perf_counter()
    subprocess.run(["sync"], check=False)
    sync_s = time.perf_counter() - started
    m = json.loads(result_json.read_text())
    if m["rc"] != 0:
        tail = err_log.read_text(errors="replace")[-4000:]
        raise SystemExit(f"bench: {name} exited {m['rc']}:\n{tail}")
    return m, out_log.read_text(errors="replace"), sync_s


def run_contender(
    name: str,
    src: Path,
    out_root: Path,
    logs: Path,
    shard: str,
    expected: int,
    timeout: float,
    can_drop: bool,
) -> Result:
    dst = out_root / name
    if dst.exists():
        shutil.rmtree(dst)
    cmd, warm = contender_cmd(name, src, dst, shard)
    m, stdout, sync_s = measured_run(name, cmd, warm, logs, timeout, can_drop)
    samples, extra = verify(name, dst, expected, stdout)
    if samples != expected:
        raise SystemExit(f"bench: {name} wrote {samples} samples, expected {expected}")
    if name in PEERS:
        peer = last_json(stdout)
        work = peer.get("work_s")
        if peer.get("note"):
            extra["note"] = peer["note"]
    elif name == "cp":
        work = m["wall_s"]
    else:
        work = extra.get("summary_seconds")
    extra["stragglers_killed"] = m["stragglers_killed"]
    extra["subreaper"] = m["subreaper"]
    return Result.of(name, m, work, sync_s, dst, samples, extra)


def profile_shardfeed(src: Path, out_root: Path, shard: str, top: int) -> None:
    """Re-run ``sf-header-1w`` under cProfile (not timed) and print where its time goes."""
    import pstats

    dst = out_root / "sf-profile"
    if dst.exists():
        shutil.rmtree(dst)
    prof = out_root / "sf-header-1w.prof"
    cmd, _ = contender_cmd("sf-header-1w", src, dst, shard)
    subprocess.run(
        [sys.executable, "-m", "cProfile", "-o", str(prof), *cmd[1:]],
        check=True,
        capture_output=True,
    )
    stats = pstats.Stats(str(prof))
    print(f"\ncProfile of sf-header-1w ({prof}); top {top} by own time, then by cumulative time:")
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(top)
    sys.stdout.flush()


def fmt_table(results: list[Result], files: int, in_bytes: int) -> str:
    head = (
        "contender",
        "wall s",
        "work s",
        "sync s",
        "cpu s",
        "samples/s",
        "MB/s in",
        "peak RSS MB",
        "tree RSS MB",
        "out MB",
        "samples",
    )
    rows = [head]
    for r in results:
        rows.append(
            (
                r.name,
                f"{r.wall_s:.2f}",
                f"{r.work_s:.2f}" if r.work_s is not None else "-",
                f"{r.sync_s:.2f}",
                f"{r.cpu_s:.2f}",
                f"{files / r.wall_s:,.0f}",
                f"{in_bytes / r.wall_s / 1e6:.1f}",
                f"{r.peak_rss_bytes / 1e6:.0f}",
                f"{r.tree_rss_bytes / 1e6:.0f}",
                f"{r.out_bytes / 1e6:.1f}",
                f"{r.samples:,}",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = []
    for n, row in enumerate(rows):
        cells = [row[0].ljust(widths[0])] + [
            c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True)
        ]
        lines.append("  ".join(cells))
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "_measure":
        sep = argv.index("--")
        return measure(*argv[1:4], argv[sep + 1 :])
    if argv and argv[0] in ("_wds", "_mds"):
        fn = peer_wds if argv[0] == "_wds" else peer_mds
        print(json.dumps(fn(argv[1], argv[2], int(argv[3]))), flush=True)
        return 0

    parser = argparse.ArgumentParser(
        description=(
            "Benchmark `shardfeed convert` of a generated image-folder corpus against WebDataset "
            "ShardWriter, mosaicml-streaming MDSWriter and `cp -r`: wall time, throughput, peak memory, "
            "output size. Prints a table, then as the last line a JSON object "
            '{"vs_best_peer": x, "vs_copy": y, "samples_per_s": z, ...}. '
            "Run it through scripts/bench_convert.sh, which sets up .venv-bench."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"small corpus ({QUICK['files']:,} files, ~60 MB, {QUICK['shard']} shards) "
        f"instead of the full one ({FULL['files']:,} files, ~600 MB, {FULL['shard']} shards)",
    )
    parser.add_argument(
        "--workdir",
        type=Path,
        help="where the corpus and outputs go (default: a new temporary directory under "
        "out/bench, removed at the end unless --keep); a corpus already in "
        "WORKDIR/corpus made with the same parameters is reused",
    )
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument(
        "--files", type=int, help="corpus files (overrides the --quick/full default)"
    )
    parser.add_argument(
        "--docs",
        type=int,
        help="documents per file of the text, text-gz and parquet kinds' 8 files (default "
        "12,500; 2,500 with --quick): a larger corpus shows how the work divides over workers "
        "once a run's fixed start and end costs are a smaller share",
    )
    parser.add_argument("--target-shard-size", help="target shard size for every contender")
    parser.add_argument("--seed", type=int, default=0, help="corpus seed")
    parser.add_argument(
        "--contenders",
        default=",".join(ALL_CONTENDERS),
        help="comma-separated subset of: " + ", ".join(ALL_CONTENDERS),
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="runs per contender; the table shows the fastest (memory: the largest)",
    )
    parser.add_argument(
        "--no-drop-caches",
        action="store_true",
        help="do not try to drop the OS page cache before each contender",
    )
    parser.add_argument(
        "--timeout", type=float, help="seconds allowed per contender (default 300 quick, 1800 full)"
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="afterwards, re-run sf-header-1w under cProfile and print the top functions",
    )
    parser.add_argument(
        "--kind",
        choices=(*KINDS, "all"),
        default="image",
        help="which corpus: image (an image folder), text (JSONL), text-gz (.jsonl.gz/.zst at 4 "
        "and 64 shards), parquet, tfrecord (tf.train.Example), lerobot (v2.1 -> v3.0 against "
        "LeRobot's own converter); all runs them in turn (scripts/bench_convert_text.py has the "
        "text kinds' contenders)",
    )
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    if args.docs is not None and not 1 <= args.docs <= 10_000_000:
        parser.error("--docs must be between 1 and 10,000,000 documents per file")
    kinds = KINDS if args.kind == "all" else (args.kind,)
    blocks = {}
    for kind in kinds:
        if kind == "image":
            blocks[kind] = run_image(args, parser)
        elif kind == "lerobot":
            import bench_convert_lerobot

            workdir = (args.workdir or REPO / "out" / "bench" / "text").resolve()
            workdir.mkdir(parents=True, exist_ok=True)
            names = (
                None if args.contenders == ",".join(ALL_CONTENDERS) else args.contenders.split(",")
            )
            timeout = args.timeout or (300 if args.quick else 1800)
            blocks[kind] = bench_convert_lerobot.run_kind(
                workdir, args.quick, names, timeout, not args.no_drop_caches
            )
        else:
            import bench_convert_text

            workdir = args.workdir or REPO / "out" / "bench" / "text"
            workdir.mkdir(parents=True, exist_ok=True)
            names = (
                None if args.contenders == ",".join(ALL_CONTENDERS) else args.contenders.split(",")
            )
            timeout = args.timeout or (300 if args.quick else 1800)
            drop = not args.no_drop_caches
            blocks[kind] = bench_convert_text.run_kind(
                kind, workdir.resolve(), args.quick, names, timeout, drop, args.docs
            )
        print(f"bench: {kind}: {json.dumps(blocks[kind])}", file=sys.stderr, flush=True)
    print(json.dumps(blocks), flush=True)
    return 0


def run_image(args: argparse.Namespace, parser: argparse.ArgumentParser) -> dict:
    """The image kind: print its table and notes, return its block of the last line."""
    preset = dict(QUICK if args.quick else FULL)
    if args.files:
        preset["files"] = args.files
    shard = args.target_shard_size or preset["shard"]
    names = [n.strip() for n in args.contenders.split(",") if n.strip()]
    unknown = set(names) - set(ALL_CONTENDERS)
    if unknown:
        parser.error(f"unknown contenders: {', '.join(sorted(unknown))}")
    timeout = args.timeout or (300 if args.quick else 1800)

    if args.workdir:
        workdir, temporary = args.workdir.resolve(), False
        workdir.mkdir(parents=True, exist_ok=True)
    else:
        (REPO / "out" / "bench").mkdir(parents=True, exist_ok=True)
        workdir, temporary = (
            Path(tempfile.mkdtemp(prefix="bench-", dir=REPO / "out" / "bench")),
            True,
        )
    corpus, out_root, logs = workdir / "corpus", workdir / "outputs", workdir / "logs"
    out_root.mkdir(exist_ok=True)
    logs.mkdir(exist_ok=True)

    try:
        started = time.perf_counter()
        info = make_corpus(
            corpus,
            preset["files"],
            preset["classes"],
            preset["min_kb"],
            preset["max_kb"],
            args.seed,
        )
        files, in_bytes = info["files"], info["bytes"]
        print(
            f"bench: corpus {corpus}: {files:,} JPEGs in {preset['classes']} classes, "
            f"{in_bytes / 1e6:.1f} MB ({time.perf_counter() - started:.1f} s to make or reuse)",
            file=sys.stderr,
            flush=True,
        )

        can_drop = not args.no_drop_caches and drop_caches()
        results = []
        for name in names:
            runs = [
                run_contender(name, corpus, out_root, logs, shard, files, timeout, can_drop)
                for _ in range(args.repeat)
            ]
            best = min(runs, key=lambda r: r.wall_s)  # the fastest run; memory: the largest seen
            best.peak_rss_bytes = max(r.peak_rss_bytes for r in runs)
            best.tree_rss_bytes = max(r.tree_rss_bytes for r in runs)
            results.append(best)
        if args.profile:
            profile_shardfeed(corpus, out_root, shard, 30)
    finally:
        if temporary and not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)

    by = {r.name: r for r in results}
    tput = {r.name: files / r.wall_s for r in results}
    cores = os.cpu_count() or 1
    print()
    print(
        f"corpus: {files:,} JPEG files in {preset['classes']} class dirs, {in_bytes / 1e6:.1f} MB "
        f"(mean {in_bytes / files / 1e3:.1f} KB); target shard size {shard} for every contender; "
        f"{cores} cores; Python {sys.version.split()[0]}"
    )
    print(
        "page cache: "
        + (
            "dropped before each contender (sync; echo 3 > /proc/sys/vm/drop_caches), imports re-warmed"
            if can_drop
            else "NOT dropped (not permitted or --no-drop-caches); the corpus is warm"
        )
    )
    print(
        "peak RSS = largest single process of the contender's tree (getrusage RUSAGE_CHILDREN via a "
        "subreaper); tree RSS = largest sampled sum over the tree (50 ms); cpu = whole tree"
    )
    print(
        "wall = whole command incl. interpreter start and imports; samples/s and MB/s use wall; "
        "sync = flushing the output afterwards (not in wall)"
    )
    if args.repeat > 1:
        print(
            f"each contender ran {args.repeat} times: the fastest run is shown, with the largest memory"
        )
    if args.workdir or args.keep:
        print(f"work directory: {workdir}")
    print()
    print(fmt_table(results, files, in_bytes))

    summary: dict = {}
    sf = [n for n in SF_HEADER if n in by]
    peers = [n for n in PEERS if n in by]
    notes = []
    if sf:
        best_sf = max(sf, key=lambda n: tput[n])
        summary["samples_per_s"] = round(tput[best_sf], 1)
        if peers:
            best_peer = max(peers, key=lambda n: tput[n])
            summary["vs_best_peer"] = round(tput[best_sf] / tput[best_peer], 3)
            summary["best_peer"] = best_peer
            by_work = {n: by[n].work_s for n in [*sf, *peers] if by[n].work_s}
            if set(sf) & set(by_work) and set(peers) & set(by_work):
                summary["vs_best_peer_work"] = round(
                    min(by_work[p] for p in peers if p in by_work)
                    / min(by_work[s] for s in sf if s in by_work),
                    3,
                )
            durable = {n: by[n].wall_s + by[n].sync_s for n in [*sf, *peers]}
            summary["vs_best_peer_durable"] = round(
                min(durable[p] for p in peers) / min(durable[s] for s in sf), 3
            )
        if "cp" in by:
            summary["vs_copy"] = round(tput[best_sf] / tput["cp"], 3)
            summary["vs_copy_durable"] = round(
                (by["cp"].wall_s + by["cp"].sync_s) / (by[best_sf].wall_s + by[best_sf].sync_s), 3
            )
        summary["best_shardfeed"] = best_sf
        for mode in ("2w", "2t"):  # two processes, two threads, over one thread
            if f"sf-header-{mode}" in by and "sf-header-1w" in by:
                scale = tput[f"sf-header-{mode}"] / tput["sf-header-1w"]
                summary[f"scale_{mode}"] = round(scale, 3)
    if "sf-full-1w" in by and "sf-header-1w" in by:
        full, header = by["sf-full-1w"], by["sf-header-1w"]
        workers = 1  # both run on the in-process runner: one core busy
        summary["full_decode_ms_per_file_per_core"] = round(
            (full.wall_s - header.wall_s) * workers / files * 1e3, 3
        )
        summary["full_decode_cpu_ms_per_file"] = round((full.cpu_s - header.cpu_s) / files * 1e3, 3)
        summary["full_samples_per_s"] = round(tput["sf-full-1w"], 1)
        notes.append(
            f"--validate full costs {summary['full_decode_ms_per_file_per_core']} ms per file per core "
            f"((t_full - t_header) x 1 core / files, both on the 1-worker in-process runner); by CPU time "
            f"{summary['full_decode_cpu_ms_per_file']} ms per file"
        )
    summary.update(
        {
            "files": files,
            "input_mb": round(in_bytes / 1e6, 1),
            "target_shard_size": shard,
            "caches_dropped": can_drop,
            "throughput_samples_per_s": {n: round(v, 1) for n, v in tput.items()},
            "peak_rss_mb": {r.name: round(r.peak_rss_bytes / 1e6) for r in results},
            "tree_rss_mb": {r.name: round(r.tree_rss_bytes / 1e6) for r in results},
        }
    )
    for r in results:
        if r.extra.get("note"):
            notes.append(f"{r.name}: {r.extra['note']}")
        if r.extra.get("stragglers_killed"):
            notes.append(
                f"{r.name}: {r.extra['stragglers_killed']} leftover processes killed after it exited"
            )
    print()
    for note in notes:
        print(note)
    head = {k: summary.pop(k) for k in ("vs_best_peer", "vs_copy", "samples_per_s") if k in summary}
    return {**head, **summary}


if __name__ == "__main__":
    sys.exit(main())
