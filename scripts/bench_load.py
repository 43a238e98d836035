#!/usr/bin/env python3
"""Loading benchmark: shardfeed's ``ShardLoader`` against the ways a training job reads data today.

Two generated corpora, identical for every system, are each stored five ways and read back in
batches of 256 with no image decode, from a cold and from a warm page cache:

==================  ===============================================================================
per-file            one file per sample (``class_NNN/NNNNNNN.jpg``; robot: one 284-byte record per
                    frame), read in a RANDOM order (a fresh permutation per pass), as a
                    ``torch`` map-style dataset under a shuffling sampler reads it
webdataset          ``webdataset.WebDataset(tars, shardshuffle=False)``: tar shards, no decoder, so
                    every field arrives as the raw ``bytes`` of its tar member. Written with
                    ``ShardWriter(..., mtime=0)``: a fixed integer mtime, as its docs suggest for
                    reproducible tars; the default float mtime adds a PAX header to every member,
                    which halves the read rate
mds                 ``streaming.StreamingDataset(local=DIR, remote=None, shuffle=False)`` over
                    ``MDSWriter`` shards (image: ``bytes`` + ``int``; robot: ``ndarray:float32:32``
                    vectors, ``int64`` indices, ``float32`` timestamp), no compression
lerobot-v2.1        robot corpus only: per-episode Parquet files ``data/chunk-000/episode_*.parquet``
                    (snappy, as HF ``datasets`` writes them), read with ``pyarrow.parquet.read_table``
                    one episode at a time, episodes in random order
shardfeed           ``shardfeed.loader.ShardLoader(path, rank=0, world=1, batch_size=256, ...)`` over
                    a dataset written with ``shardfeed.write_dataset`` (100 MB shards, 4 MiB row
                    groups); images arrive as zero-copy memoryviews
shardfeed (bytes    the same loader, but the consumer turns every image memoryview into ``bytes``
copies)             first, as the peers hand out ``bytes``: the cost of one malloc + copy per sample
                    (reads ``shardfeed-bytes/``, a byte-identical copy of the dataset)
cat                 one ``cat`` process over shardfeed's shard files into /dev/null: the physical
                    limit of reading those bytes in one sequential stream (reads
                    ``shardfeed-cat/``, another byte-identical copy)
==================  ===============================================================================

Every system gets the same shard target (100 MB) and runs in one process with its simplest
iterator (no DataLoader workers); shardfeed's loader uses its own prefetch threads, as shipped.
Peers that yield one sample at a time are accumulated into lists of 256 samples.

How each figure is measured
---------------------------
- The consumer is the same for all: for every delivered image (or vector) buffer it takes
  ``memoryview(x)[::4096].tobytes()`` -- one byte of every 4 KiB page, so a lazily mapped buffer
  really is read -- and adds its length; labels and indices are counted. Nothing is decoded.
- Each system is measured in its own child process (``bench_load.py _serve``, one per system, so
  torch is imported once); every run builds its reader from scratch. The clock starts before the
  reader is constructed (directory scan, index loading and loader setup count) and stops after
  the last batch is consumed; imports and garbage collection are off the clock.
- **cold**: before the run, ``posix_fadvise(POSIX_FADV_DONTNEED)`` on every file of that system's
  copy (data and metadata; directory entries and inodes stay cached). One pass, cut off after
  ``--max-seconds`` (the per-file baseline at random order usually is). ``--cold-repeats`` runs
  (default 2); the table shows the BEST run per system.
- That drops this machine's page cache, not a cache below it: on a VM the host may keep the
  virtual disk's blocks (three "cold" cats of one 1 GB copy here ran at 576, 952 and 1332 MB/s).
  So no two contenders share a file (shardfeed, its bytes-copies row and cat each read their own
  copy) and every contender reads its copy once per cold round: all get the same treatment, and
  later rounds are warmer below the VM for all of them. Cold figures are an upper bound.
- Rounds interleave the contenders; the order rotates each round and reverses every other round.
- A run in which the consumer waited more than 0.5 s for one batch (after the first) says
  ``STALL`` in its line, with that wait (``max_batch_wait_s`` in the run's record).
- ``CPU %`` in the table is the reading process's CPU time (all its threads; for cat, cat's) over
  the wall time: above 100 a reader keeps more than one core busy, and on a shared machine a
  reader that needs more CPU than it gets shows it here.
- **warm**: every file of the copy is read once first, then passes are repeated until
  ``--min-warm-seconds`` have elapsed (each pass a new epoch); best of ``--warm-repeats`` runs.
- **cat**: ``cat`` of the shard files (cold: pages dropped first), same repeats, best run.
  Its samples/s is the dataset's samples over cat's seconds, so ``vs_raw_read`` compares the same
  bytes.
- Generated corpora are kept under ``--work`` (default ``out/bench_load``) and reused when their
  parameters match; after writing, ``sync`` runs so cold drops are not blocked by dirty pages.

The last line printed is JSON: ``{"vs_per_file": a, "vs_best_peer": b, "vs_raw_read": c,
"warm": {...}, "robot": {...}, ...}``. The top-level ratios are COLD, image corpus: shardfeed
samples/s over per-file, over the best of webdataset/MDS (and LeRobot v2.1 for robot), and over
cat's samples/s. Targets: vs_per_file >= 10, vs_best_peer >= 1.5, vs_raw_read >= 0.8.
``cold_round1`` holds the same ratios from the first cold round only (the coldest below the VM,
one sample each); ``bytes_copies`` the ratios of the bytes-copies row.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import io
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CORPUS_VERSION = 3
BATCH = 256
PAGE = 4096  # the consumer touches one byte per page of every buffer it gets
SHARD_BYTES = 100_000_000  # 100 MB: the shard target of every sharded system
ROW_GROUP = "4MiB"
IMAGE_SIDE = 224  # every pool JPEG is 224 x 224 RGB, ~20 KB
POOL = 256  # distinct JPEG encodes; samples are made unique with a COM segment
CLASSES = 100
DIM = 32  # robot state / action width
FPS = 30
# one robot frame: state + action (float32 x 32 each), episode/frame/index (int64), timestamp (f32)
ROBOT_RECORD = [
    ("observation.state", "<f4", (DIM,)),
    ("action", "<f4", (DIM,)),
    ("episode_index", "<i8"),
    ("frame_index", "<i8"),
    ("index", "<i8"),
    ("timestamp", "<f4"),
]
ROBOT_SAMPLE_BYTES = 2 * DIM * 4 + 3 * 8 + 4  # 284
ROBOT_COLUMNS = [name for name, *_ in ROBOT_RECORD]

FULL = {
    "images": 50_000,
    "episodes": 400,
    "max_seconds": 10.0,
    "min_warm_seconds": 3.0,
    "cold_repeats": 2,
    "warm_repeats": 2,
}
QUICK = {
    "images": 20_000,
    "episodes": 100,
    "max_seconds": 3.0,
    "min_warm_seconds": 1.0,
    "cold_repeats": 2,
    "warm_repeats": 1,
}
EPISODE_FRAMES = (300, 1300)  # episode lengths, uniform
STALL_S = 0.5  # a run whose consumer waited longer than this for one batch says so
TARGETS = {"vs_per_file": 10.0, "vs_best_peer": 1.5, "vs_raw_read": 0.8}
SYSTEMS = {
    "image": ("per-file", "webdataset", "mds", "shardfeed", "shardfeed-bytes"),
    "robot": ("per-file", "webdataset", "mds", "lerobot-v2.1", "shardfeed"),
}
PEERS = ("webdataset", "mds", "lerobot-v2.1")
LABELS = {
    "per-file": "per-file (random)",
    "webdataset": "webdataset",
    "mds": "mds (streaming)",
    "lerobot-v2.1": "lerobot v2.1 parquet",
    "shardfeed": "shardfeed",
    "shardfeed-bytes": "shardfeed (bytes copies)",
    "cat": "cat (raw read)",
}
COPY_DIRS = {  # system -> the directory of its copy inside a corpus directory
    "per-file": "per-file",
    "webdataset": "webdataset",
    "mds": "mds",
    "lerobot-v2.1": "lerobot-v2.1",
    "shardfeed": "shardfeed",
    "shardfeed-bytes": "shardfeed-bytes",  # a byte-identical copy of shardfeed/
    "cat": "shardfeed-cat",  # another one
}
# fadvise drops this VM's page cache, but the host may still cache the virtual disk (repeated
# "cold" cats of one 1 GB copy here ran at 576, 952 and 1332 MB/s). So no two contenders share
# files: each reads its own copy, once per cold round, and all get the same treatment.
COPIES_OF_SHARDFEED = ("shardfeed-bytes", "cat")


# --------------------------------------------------------------------------------------------------
# Corpora: the same samples for every system
# --------------------------------------------------------------------------------------------------


def make_pool(seed: int) -> list[bytes]:
    """``POOL`` distinct real JPEGs of ``IMAGE_SIDE``² pixels, sizes spread over 17-23 KB."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    side = IMAGE_SIDE
    pool = []
    for slot in range(POOL):
        target = 20_000 * (0.85 + 0.3 * (slot + 0.5) / POOL)
        cells = rng.integers(0, 256, size=(side // 16, side // 16, 3), dtype=np.uint8)
        image = Image.fromarray(cells).resize((side, side), Image.BILINEAR)
        base = np.asarray(image, dtype=np.float32)
        grain = rng.normal(0.0, 1.0, size=(side, side, 3)).astype(np.float32)
        quality = int(rng.integers(80, 93))
        noise = 8.0
        for _ in range(10):  # grain amplitude ~ bytes: a few corrections land within 3%
            buf = io.BytesIO()
            pixels = np.clip(base + noise * grain, 0, 255).astype(np.uint8)
            Image.fromarray(pixels).save(buf, format="JPEG", quality=quality)
            data = buf.getvalue()
            if abs(len(data) - target) <= 0.03 * target:
                break
            noise *= (target / len(data)) ** 1.5
        pool.append(data)
    return pool


def with_comment(jpeg: bytes, text: bytes) -> bytes:
    """Insert a COM segment right after SOI: still a valid JPEG, and its bytes are unique."""
    return jpeg[:2] + b"\xff\xfe" + (len(text) + 2).to_bytes(2, "big") + text + jpeg[2:]


class ImageCorpus:
    """``n`` samples: ``image(i)`` is a unique real JPEG of ~20 KB, ``labels[i]`` its class."""

    def __init__(self, n: int, seed: int) -> None:
        import numpy as np

        self.n = n
        self.seed = seed
        self.pool = make_pool(seed)
        rng = np.random.default_rng(seed + 1)
        self.picks = rng.integers(0, POOL, size=n)
        self.labels = rng.integers(0, CLASSES, size=n).astype(np.int64)

    def image(self, i: int) -> bytes:
        return with_comment(
            self.pool[self.picks[i]], b"shardfeed bench_load %d %d" % (self.seed, i)
        )


def robot_frames(episodes: int, seed: int) -> dict:
    """Columns of an episodic robot corpus: (N, 32) float32 state and action, int64 indices."""
    import numpy as np

    rng = np.random.default_rng(seed + 2)
    lengths = rng.integers(EPISODE_FRAMES[0], EPISODE_FRAMES[1] + 1, size=episodes)
    n = int(lengths.sum())
    frame = np.concatenate([np.arange(k, dtype=np.int64) for k in lengths])
    state = rng.normal(0.0, 1.0, size=(n, DIM)).astype(np.float32)
    action = (state + rng.normal(0.0, 0.01, size=(n, DIM))).astype(np.float32)
    return {
        "observation.state": state,
        "action": action,
        "episode_index": np.repeat(np.arange(episodes, dtype=np.int64), lengths),
        "frame_index": frame,
        "index": np.arange(n, dtype=np.int64),
        "timestamp": (frame / FPS).astype(np.float32),
        "lengths": lengths,
    }


def robot_records(frames: dict):
    """The frames as one packed 284-byte record each (numpy structured array)."""
    import numpy as np

    records = np.empty(len(frames["index"]), dtype=np.dtype(ROBOT_RECORD))
    for name in ROBOT_COLUMNS:
        records[name] = frames[name]
    return records


# --------------------------------------------------------------------------------------------------
# Writers: one per (corpus, system); each writes a complete copy into ``dst``
# --------------------------------------------------------------------------------------------------


def write_perfile_images(dst: Path, corpus: ImageCorpus) -> None:
    for c in range(CLASSES):
        (dst / f"class_{c:03d}").mkdir(parents=True)
    for i in range(corpus.n):
        with open(dst / f"class_{corpus.labels[i]:03d}" / f"{i:07d}.jpg", "wb") as f:
            f.write(corpus.image(i))


def write_wds_images(dst: Path, corpus: ImageCorpus) -> None:
    import webdataset as wds

    dst.mkdir(parents=True)
    with wds.ShardWriter(
        str(dst / "shard-%06d.tar"), maxsize=SHARD_BYTES, maxcount=10**9, verbose=0, mtime=0
    ) as sink:
        for i in range(corpus.n):
            sink.write(
                {"__key__": f"{i:07d}", "jpg": corpus.image(i), "cls": int(corpus.labels[i])}
            )


def write_mds_images(dst: Path, corpus: ImageCorpus) -> None:
    streaming = import_streaming()
    with streaming.MDSWriter(
        out=str(dst),
        columns={"image": "bytes", "label": "int"},
        size_limit=SHARD_BYTES,
        compression=None,
        progress_bar=False,
    ) as sink:
        for i in range(corpus.n):
            sink.write({"image": corpus.image(i), "label": int(corpus.labels[i])})


def write_shardfeed_images(dst: Path, corpus: ImageCorpus) -> None:
    import shardfeed

    features = {
        "image": {"dtype": "image", "shape": [IMAGE_SIDE, IMAGE_SIDE, 3]},
        "label": {"dtype": "int64", "shape": [1]},
    }
    data = {"image": [corpus.image(i) for i in range(corpus.n)], "label": corpus.labels}
    shardfeed.write_dataset(
        dst,
        features,
        data,
        target_shard_size=SHARD_BYTES,
        row_group_size=ROW_GROUP,
        source="scripts/bench_load.py: image corpus",
    )


def write_perfile_robot(dst: Path, frames: dict) -> None:
    records = robot_records(frames)
    episodes = frames["episode_index"]
    for e in range(len(frames["lengths"])):
        (dst / f"episode_{e:06d}").mkdir(parents=True)
    for i, record in enumerate(records):
        path = dst / f"episode_{episodes[i]:06d}" / f"frame_{frames['frame_index'][i]:06d}.bin"
        with open(path, "wb") as f:
            f.write(record.tobytes())


def write_wds_robot(dst: Path, frames: dict) -> None:
    import webdataset as wds

    records = robot_records(frames)
    dst.mkdir(parents=True)
    with wds.ShardWriter(
        str(dst / "shard-%06d.tar"), maxsize=SHARD_BYTES, maxcount=10**9, verbose=0, mtime=0
    ) as sink:
        for i, record in enumerate(records):
            sink.write({"__key__": f"{i:08d}", "frame": record.tobytes()})


def write_mds_robot(dst: Path, frames: dict) -> None:
    streaming = import_streaming()
    columns = {
        "observation.state": f"ndarray:float32:{DIM}",
        "action": f"ndarray:float32:{DIM}",
        "episode_index": "int64",
        "frame_index": "int64",
        "index": "int64",
        "timestamp": "float32",
    }
    with streaming.MDSWriter(
        out=str(dst), columns=columns, size_limit=SHARD_BYTES, compression=None, progress_bar=False
    ) as sink:
        for i in range(len(frames["index"])):
            sink.write({name: frames[name][i] for name in ROBOT_COLUMNS})


def write_lerobot21_robot(dst: Path, frames: dict) -> None:
    """LeRobot v2.1 layout: one Parquet file per episode (snappy, as HF datasets writes them)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    lengths = frames["lengths"]
    (dst / "meta").mkdir(parents=True)
    (dst / "data/chunk-000").mkdir(parents=True)
    starts = np.r_[0, np.cumsum(lengths)]
    for e in range(len(lengths)):
        a, b = int(starts[e]), int(starts[e + 1])
        cols = {}
        for name in ROBOT_COLUMNS:
            values = frames[name][a:b]
            if values.ndim == 2:
                cols[name] = pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1)), DIM)
            else:
                cols[name] = pa.array(values)
        pq.write_table(pa.table(cols), dst / f"data/chunk-000/episode_{e:06d}.parquet")
    with open(dst / "meta/episodes.jsonl", "w") as f:
        for e, k in enumerate(lengths.tolist()):
            f.write(json.dumps({"episode_index": e, "tasks": ["bench"], "length": k}) + "\n")
    info = {
        "codebase_version": "v2.1",
        "fps": FPS,
        "total_episodes": len(lengths),
        "total_frames": int(starts[-1]),
        "chunks_size": 1000,
        "data_path": "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet",
    }
    (dst / "meta/info.json").write_text(json.dumps(info, indent=2))


def write_shardfeed_robot(dst: Path, frames: dict) -> None:
    import shardfeed

    features = {
        "observation.state": {"dtype": "float32", "shape": [DIM]},
        "action": {"dtype": "float32", "shape": [DIM]},
        "episode_index": {"dtype": "int64", "shape": [1]},
        "frame_index": {"dtype": "int64", "shape": [1]},
        "index": {"dtype": "int64", "shape": [1]},
        "timestamp": {"dtype": "float32", "shape": [1]},
    }
    shardfeed.write_dataset(
        dst,
        features,
        {name: frames[name] for name in ROBOT_COLUMNS},
        target_shard_size=SHARD_BYTES,
        row_group_size=ROW_GROUP,
        fps=FPS,
        source="scripts/bench_load.py: robot corpus",
    )


WRITERS: dict[tuple[str, str], Callable[[Path, object], None]] = {
    ("image", "per-file"): write_perfile_images,
    ("image", "webdataset"): write_wds_images,
    ("image", "mds"): write_mds_images,
    ("image", "shardfeed"): write_shardfeed_images,
    ("robot", "per-file"): write_perfile_robot,
    ("robot", "webdataset"): write_wds_robot,
    ("robot", "mds"): write_mds_robot,
    ("robot", "lerobot-v2.1"): write_lerobot21_robot,
    ("robot", "shardfeed"): write_shardfeed_robot,
}


def corpus_dir(work: Path, corpus: str, size: int, seed: int) -> Path:
    return work / (f"image-{size}-s{seed}" if corpus == "image" else f"robot-{size}ep-s{seed}")


def ensure_copies(root: Path, corpus: str, size: int, seed: int) -> dict[str, dict]:
    """Write every missing or stale copy of one corpus; reuse the ones whose stamp matches."""
    params = {"version": CORPUS_VERSION, "corpus": corpus, "size": size, "seed": seed}
    made: dict[str, dict] = {}
    data = None
    for system in dict.fromkeys(COPY_DIRS[s] for s in (*SYSTEMS[corpus], "cat")):
        dst = root / system
        if made.get("shardfeed", {}).get("reused") is False and system in (
            COPY_DIRS[c] for c in COPIES_OF_SHARDFEED
        ):
            (root / f".{system}.bench-load.json").unlink(missing_ok=True)  # copy the new one
        stamp = root / f".{system}.bench-load.json"
        if stamp.exists() and dst.exists() and json.loads(stamp.read_text()) == params:
            made[system] = {"reused": True, "seconds": 0.0}
            continue
        stamp.unlink(missing_ok=True)
        shutil.rmtree(dst, ignore_errors=True)
        started = time.perf_counter()
        if system in (COPY_DIRS[c] for c in COPIES_OF_SHARDFEED):
            shutil.copytree(root / "shardfeed", dst)
        else:
            if data is None:
                data = ImageCorpus(size, seed) if corpus == "image" else robot_frames(size, seed)
            WRITERS[(corpus, system)](dst, data)
        os.sync()  # no dirty pages left: a cold drop really drops
        stamp.write_text(json.dumps(params))
        made[system] = {"reused": False, "seconds": time.perf_counter() - started}
        print(f"  wrote {corpus} {system:<15} in {made[system]['seconds']:6.1f} s", flush=True)
    return made


# --------------------------------------------------------------------------------------------------
# Page cache
# --------------------------------------------------------------------------------------------------


def files_under(root: Path) -> list[str]:
    out = []
    for dirpath, _, names in os.walk(root):
        out.extend(os.path.join(dirpath, name) for name in names)
    return sorted(out)


def drop_pages(paths: list[str]) -> None:
    """Evict every page of ``paths`` from the page cache (they are clean: written and synced)."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def load_pages(paths: list[str]) -> None:
    """Read every byte of ``paths`` once, so they sit in the page cache."""
    buf = bytearray(1 << 22)
    for path in paths:
        with open(path, "rb", buffering=0) as f:
            while f.readinto(buf):
                pass


def shard_files(root: Path) -> list[str]:
    return sorted(str(p) for p in (root / "data").glob("chunk-*/file-*.parquet"))


def cat_seconds(paths: list[str]) -> tuple[float, float]:
    """Wall and CPU seconds (user + system) of one ``cat`` of ``paths`` into /dev/null."""
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run(["cat", *paths], stdout=subprocess.DEVNULL, check=True)
    seconds = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return seconds, after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


# --------------------------------------------------------------------------------------------------
# Readers (run in the measuring process): ``Reader(root, corpus, seed)``, then ``epoch(k)`` yields
# the batches of pass k
# --------------------------------------------------------------------------------------------------
#
# An image batch is (images, labels): a sequence of bytes-like objects and a sequence or array of
# labels. A robot batch is (n, buffers): n samples and the buffers (arrays or bytes) delivering them.


def import_streaming():
    """``import streaming``, stubbing out ``streaming.vision`` when torchvision cannot load.

    PyPI's torchvision can fail beside a CPU-only torch (``operator torchvision::nms does not
    exist``); MDS needs neither, so a broken torchvision gets an empty ``streaming.vision``
    (as scripts/bench_convert.py does).
    """
    try:
        import torchvision  # noqa: F401
    except Exception:
        import types

        for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[name]
        sys.modules["streaming.vision"] = types.ModuleType("streaming.vision")
    import streaming

    return streaming


def _batched(samples: Iterator, fields: list[str]) -> Iterator[list[list]]:
    """Per-sample dicts -> lists of up to ``BATCH`` values per field."""
    cols: list[list] = [[] for _ in fields]
    for sample in samples:
        for col, field in zip(cols, fields, strict=True):
            col.append(sample[field])
        if len(cols[0]) == BATCH:
            yield cols
            cols = [[] for _ in fields]
    if cols[0]:
        yield cols


class PerFile:
    """One file per sample, read in a fresh random order every pass (open, read, close)."""

    def __init__(self, root: str, corpus: str, seed: int) -> None:
        import numpy as np

        self.corpus = corpus
        self.seed = seed
        self.items: list[tuple[str, int]] = []
        for d in sorted(os.scandir(root), key=lambda e: e.name):
            label = int(d.name.rsplit("_", 1)[1])
            self.items.extend((f.path, label) for f in os.scandir(d.path))
        self.np = np

    def epoch(self, k: int) -> Iterator:
        order = self.np.random.default_rng([self.seed, k]).permutation(len(self.items))
        items = self.items
        for start in range(0, len(order), BATCH):
            data, labels = [], []
            for j in order[start : start + BATCH]:
                path, label = items[j]
                with open(path, "rb") as f:
                    data.append(f.read())
                labels.append(label)
            yield (data, labels) if self.corpus == "image" else (len(data), data)


class WebDatasetReader:
    def __init__(self, root: str, corpus: str, seed: int) -> None:
        import webdataset as wds

        self.corpus = corpus
        urls = sorted(str(p) for p in Path(root).glob("shard-*.tar"))
        self.ds = wds.WebDataset(urls, shardshuffle=False, empty_check=False)

    def epoch(self, k: int) -> Iterator:
        if self.corpus == "image":
            yield from _batched(iter(self.ds), ["jpg", "cls"])
        else:
            for (frames,) in _batched(iter(self.ds), ["frame"]):
                yield len(frames), frames


class MDSReader:
    def __init__(self, root: str, corpus: str, seed: int) -> None:
        streaming = import_streaming()
        self.corpus = corpus
        self.ds = streaming.StreamingDataset(
            local=root, remote=None, shuffle=False, batch_size=BATCH
        )

    def epoch(self, k: int) -> Iterator:
        if self.corpus == "image":
            yield from _batched(iter(self.ds), ["image", "label"])
            return
        fields = ["observation.state", "action"]
        for state, action in _batched(iter(self.ds), fields):
            yield len(state), state + action


class LeRobot21:
    """Per-episode Parquet files, episodes in random order, frames in order within each."""

    def __init__(self, root: str, corpus: str, seed: int) -> None:
        import numpy as np
        import pyarrow.parquet as pq

        self.np = np
        self.pq = pq
        self.seed = seed
        self.files = sorted(str(p) for p in Path(root).glob("data/chunk-*/episode_*.parquet"))

    def epoch(self, k: int) -> Iterator:
        np = self.np
        order = np.random.default_rng([self.seed, k]).permutation(len(self.files))
        pending: list[list] = []  # per episode: one numpy array per column
        rows = 0
        for j in order:
            table = self.pq.read_table(self.files[j], columns=ROBOT_COLUMNS)
            arrays = []
            for name in ROBOT_COLUMNS:
                col = table.column(name).combine_chunks()
                if name in ("observation.state", "action"):
                    arrays.append(col.flatten().to_numpy().reshape(-1, DIM))
                else:
                    arrays.append(col.to_numpy())
            pending.append(arrays)
            rows += table.num_rows
            if rows >= BATCH:
                merged = [np.concatenate(c) for c in zip(*pending, strict=True)]
                cut = rows - rows % BATCH
                for start in range(0, cut, BATCH):
                    yield BATCH, [a[start : start + BATCH] for a in merged]
                pending = [[a[cut:] for a in merged]] if cut < rows else []
                rows -= cut
        if rows:
            merged = [np.concatenate(c) for c in zip(*pending, strict=True)]
            yield rows, merged


class Shardfeed:
    """``ShardLoader``, a new loader per epoch, as its API has it."""

    def __init__(self, root: str, corpus: str, seed: int, samples: int = 0) -> None:
        self.root = root
        self.samples = samples
        self.corpus = corpus
        self.seed = seed
        self.columns = ["image", "label"] if corpus == "image" else ROBOT_COLUMNS
        self.metrics: list[dict] = []

    def epoch(self, k: int) -> Iterator:
        from shardfeed.loader import ShardLoader

        loader = ShardLoader(
            self.root,
            rank=0,
            world=1,
            batch_size=BATCH,
            columns=self.columns,
            seed=self.seed,
            epoch=k,
        )
        batches = iter(loader)
        left = self.samples  # the loader pads the last batch to a whole one: cut that off
        try:
            for batch in batches:
                rows = len(batch[self.columns[0]])
                if left == 0:
                    continue  # a padding batch
                if rows > left:
                    batch = {name: value[:left] for name, value in batch.items()}
                left -= min(rows, left)
                if self.corpus == "image":
                    yield batch["image"], batch["label"]
                else:
                    arrays = [batch[name] for name in ROBOT_COLUMNS]
                    yield len(arrays[0]), arrays
        finally:
            if loader is not None:
                try:
                    self.metrics.append(_jsonable(loader.metrics()))
                finally:
                    loader.close()


def _jsonable(metrics: dict) -> dict:
    out = {}
    for key, value in dict(metrics).items():
        try:
            json.dumps(value)
            out[key] = value
        except TypeError:
            out[key] = repr(value)
    return out


READERS = {
    "per-file": PerFile,
    "webdataset": WebDatasetReader,
    "mds": MDSReader,
    "lerobot-v2.1": LeRobot21,
    "shardfeed": Shardfeed,
    "shardfeed-bytes": Shardfeed,
}


# --------------------------------------------------------------------------------------------------
# The consumer and the measuring process (`bench_load.py _serve`)
# --------------------------------------------------------------------------------------------------


def consume_images(images, labels, copy: bool) -> int:
    """Touch one byte per page of every image (copying it to ``bytes`` first with ``copy``);
    return the payload bytes delivered (images + 8 per label)."""
    total = 0
    for item in images:
        if copy:
            item = bytes(item)
        view = memoryview(item)
        view[::PAGE].tobytes()
        total += view.nbytes
    return total + 8 * len(labels)


def consume_robot(buffers) -> None:
    """Touch one byte per page of every buffer (a column array, or one sample's bytes/array)."""
    import numpy as np

    for buf in buffers:
        if isinstance(buf, np.ndarray):
            buf = np.ascontiguousarray(buf)  # a no-op on the contiguous arrays every reader gives
        memoryview(buf).cast("B")[::PAGE].tobytes()


def run_child(spec: dict) -> dict:
    """One measurement: construct the reader, read passes, consume; all on the clock."""
    system, corpus = spec["system"], spec["corpus"]
    cls = READERS[system]
    kwargs = {"samples": spec["samples"]} if cls is Shardfeed else {}
    copy = system == "shardfeed-bytes"
    # off the clock: imports, stale shared memory of an earlier MDS run, garbage
    if system == "webdataset":
        import webdataset  # noqa: F401
    elif system == "mds":
        import_streaming()
        from streaming.base.util import clean_stale_shared_memory

        clean_stale_shared_memory()
    elif system.startswith("shardfeed"):
        import shardfeed.loader  # noqa: F401
    import numpy  # noqa: F401
    import pyarrow.parquet  # noqa: F401

    gc.collect()

    samples = nbytes = passes = 0
    first_batch = None
    cpu_started = time.process_time()  # every thread of this process
    started = time.perf_counter()
    reader = cls(spec["root"], corpus, spec["seed"], **kwargs)
    del kwargs
    setup = time.perf_counter() - started
    deadline = started + spec["max_seconds"]
    cut = False
    last = started
    max_gap = 0.0  # the longest wait for one batch (a stall shows here)
    while True:
        for batch in reader.epoch(passes):
            if first_batch is not None:  # the first batch's wait is "1st batch s"
                max_gap = max(max_gap, time.perf_counter() - last)
            if corpus == "image":
                nbytes += consume_images(batch[0], batch[1], copy)
                samples += len(batch[1])
            else:
                consume_robot(batch[1])
                samples += batch[0]
                nbytes += batch[0] * ROBOT_SAMPLE_BYTES
            if first_batch is None:
                first_batch = time.perf_counter() - started
            last = time.perf_counter()
            if last > deadline:
                cut = True
                break
        passes += 1  # a pass that was cut off counts too; "cut" says so
        elapsed = time.perf_counter() - started
        if cut or passes >= spec["max_passes"] or elapsed >= spec["min_seconds"]:
            break
    seconds = time.perf_counter() - started
    cpu = time.process_time() - cpu_started
    result = {
        "cpu_s": cpu,
        "samples": samples,
        "bytes": nbytes,
        "seconds": seconds,
        "passes": passes,
        "cut": cut,
        "setup_s": setup,
        "first_batch_s": first_batch,
        "max_batch_wait_s": max_gap,
        "samples_per_s": samples / seconds,
        "bytes_per_s": nbytes / seconds,
    }
    if isinstance(reader, Shardfeed) and reader.metrics:
        result["loader_metrics"] = reader.metrics[-1]
    return result


def serve() -> int:
    """``bench_load.py _serve``: one measurement per JSON line on stdin, one JSON line back.

    One such process per system serves all of that system's runs, so its imports (torch, for
    Streaming and WebDataset) are paid once; every run still builds its reader from scratch."""
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            result = run_child(json.loads(line))
        except Exception as err:  # reported by the parent with the system's name
            import traceback

            traceback.print_exc()
            result = {"error": f"{type(err).__name__}: {err}"}
        print(json.dumps(result), flush=True)
    return 0


# --------------------------------------------------------------------------------------------------
# The parent: corpora, runs, table, JSON
# --------------------------------------------------------------------------------------------------


class Bench:
    def __init__(self, args: argparse.Namespace, preset: dict) -> None:
        self.args = args
        self.preset = preset
        self.samples: dict[str, int] = {}  # corpus -> samples in it
        self.results: dict[tuple[str, str, str], list[dict]] = {}  # (corpus, system, mode) -> runs
        self.servers: dict[str, tuple[subprocess.Popen, object]] = {}  # system -> (process, stderr)

    def server(self, system: str) -> tuple[subprocess.Popen, object]:
        """The system's measuring process (``bench_load.py _serve``), started on first use."""
        if system not in self.servers:
            import tempfile

            stderr = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115  (closed in close())
            proc = subprocess.Popen(
                [sys.executable, str(Path(__file__).resolve()), "_serve"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
            )
            self.servers[system] = proc, stderr
        return self.servers[system]

    def close(self) -> None:
        for proc, stderr in self.servers.values():
            proc.stdin.close()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            stderr.close()
        self.servers.clear()

    def measure(self, corpus: str, system: str, root: Path, mode: str) -> dict:
        copy_root = root / COPY_DIRS[system]
        paths = files_under(copy_root)
        if mode == "cold":
            drop_pages(paths)
        else:
            load_pages(paths)
        spec = {
            "system": system,
            "corpus": corpus,
            "root": str(copy_root),
            "seed": self.args.seed,
            "max_seconds": self.preset["max_seconds"],
            "min_seconds": 0.0 if mode == "cold" else self.preset["min_warm_seconds"],
            "max_passes": 1 if mode == "cold" else 1000,
            "samples": self.samples[corpus],
        }
        proc, stderr = self.server(system)
        try:
            proc.stdin.write(json.dumps(spec) + "\n")
            proc.stdin.flush()
            line = proc.stdout.readline()
            result = json.loads(line) if line.strip() else {"error": "no answer"}
        except (OSError, json.JSONDecodeError) as err:
            result = {"error": f"{type(err).__name__}: {err}"}
        if "error" in result:
            stderr.seek(0)
            raise SystemExit(
                f"bench_load: {system} on the {corpus} corpus ({mode}) failed: {result['error']}\n"
                f"{stderr.read().strip()[-3000:]}"
            )
        self.results.setdefault((corpus, system, mode), []).append(result)
        return result

    def measure_cat(self, corpus: str, root: Path, mode: str, samples: int) -> dict:
        shards = shard_files(root / COPY_DIRS["cat"])
        everything = files_under(root / COPY_DIRS["cat"])
        if mode == "cold":
            drop_pages(everything)
        else:
            load_pages(shards)
        seconds, cpu = cat_seconds(shards)
        size = sum(os.path.getsize(p) for p in shards)
        result = {
            "cpu_s": cpu,
            "samples": samples,
            "bytes": size,
            "seconds": seconds,
            "samples_per_s": samples / seconds,
            "bytes_per_s": size / seconds,
        }
        self.results.setdefault((corpus, "cat", mode), []).append(result)
        return result

    def best(self, corpus: str, system: str, mode: str) -> dict | None:
        runs = self.results.get((corpus, system, mode))
        return max(runs, key=lambda r: r["samples_per_s"]) if runs else None

    def rate(self, corpus: str, system: str, mode: str, first: bool = False) -> float | None:
        """The best run's samples/s; with ``first``, the first run's (round 1: the coldest
        below the VM too, but a single sample)."""
        runs = self.results.get((corpus, system, mode))
        if not runs:
            return None
        return (
            runs[0]["samples_per_s"] if first else self.best(corpus, system, mode)["samples_per_s"]
        )


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def ratios(
    bench: Bench, corpus: str, mode: str, system: str = "shardfeed", first: bool = False
) -> dict:
    sf = bench.rate(corpus, system, mode, first)
    peers = [r for p in PEERS if (r := bench.rate(corpus, p, mode, first)) is not None]
    return {
        "vs_per_file": ratio(sf, bench.rate(corpus, "per-file", mode, first)),
        "vs_best_peer": ratio(sf, max(peers) if peers else None),
        "vs_raw_read": ratio(sf, bench.rate(corpus, "cat", mode, first)),
    }


def fmt_table(bench: Bench, corpus: str, systems: list[str]) -> str:
    head = (
        f"{'system':<26}{'mode':<6}{'samples/s':>11}{'MB/s':>8}{'x shardfeed':>12}"
        f"{'CPU %':>7}{'runs':>6}{'passes':>8}{'setup s':>9}{'1st batch s':>12}"
    )
    lines = [head, "-" * len(head)]
    for mode in ("cold", "warm"):
        sf = bench.rate(corpus, "shardfeed", mode)
        for system in [*systems, "cat"]:
            best = bench.best(corpus, system, mode)
            if best is None:
                continue
            runs = len(bench.results[(corpus, system, mode)])
            rel = best["samples_per_s"] / sf if sf else float("nan")
            passes = (
                f"{best['passes']}{'*' if best.get('cut') else ''}" if "passes" in best else "1"
            )
            setup = f"{best['setup_s']:.2f}" if "setup_s" in best else "-"
            first = f"{best['first_batch_s']:.2f}" if best.get("first_batch_s") else "-"
            lines.append(
                f"{LABELS[system]:<26}{mode:<6}{best['samples_per_s']:>11,.0f}"
                f"{best['bytes_per_s'] / 1e6:>8.0f}{rel:>12.3f}"
                f"{100 * best['cpu_s'] / best['seconds']:>7.0f}{runs:>6}{passes:>8}"
                f"{setup:>9}{first:>12}"
            )
        lines.append("")
    return "\n".join(lines).rstrip()


def fmt_targets(label: str, values: dict) -> str:
    parts = []
    for key, target in TARGETS.items():
        value = values.get(key)
        if value is None:
            parts.append(f"{key} = n/a (target >= {target})")
        else:
            verdict = "meets" if value >= target else "MISSES"
            parts.append(f"{key} = {value:.3f} {verdict} >= {target}")
    return f"{label}: " + "; ".join(parts)


def check_peers() -> list[str]:
    """The peer packages that are not installed. Only their presence is checked here; they are
    imported by the measuring processes, which report a package that fails to load."""
    from importlib.util import find_spec

    return [
        name
        for name, module in (("webdataset", "webdataset"), ("mosaicml-streaming", "streaming"))
        if find_spec(module) is None
    ]


def main(argv: list[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["_serve"]:
        return serve()
    parser = argparse.ArgumentParser(
        description="Read generated image and robot corpora with shardfeed's ShardLoader, "
        "one-file-per-sample, WebDataset, MosaicML Streaming (MDS), LeRobot v2.1 Parquet and cat; "
        "cold and warm page cache.",
        epilog="The last line printed is JSON: {'vs_per_file': a, 'vs_best_peer': b, "
        "'vs_raw_read': c, 'warm': {...}, 'robot': {...}, ...}.",
    )
    parser.add_argument(
        "--quick", action="store_true", help="20k images, 100 episodes, shorter runs (< 3 min)"
    )
    parser.add_argument(
        "--work", default="out/bench_load", help="corpora live (and are reused) here"
    )
    parser.add_argument("--images", type=int, help="image samples (default 50000; 20000 --quick)")
    parser.add_argument("--episodes", type=int, help="robot episodes (default 400; 100 --quick)")
    parser.add_argument(
        "--max-seconds", type=float, help="cut a run off after this (10; 3 --quick)"
    )
    parser.add_argument(
        "--min-warm-seconds", type=float, help="warm runs repeat passes this long (3; 1 --quick)"
    )
    parser.add_argument("--cold-repeats", type=int, help="cold runs per system (default 2)")
    parser.add_argument("--warm-repeats", type=int, help="warm runs per system (2; 1 --quick)")
    parser.add_argument("--corpora", default="image,robot", help="comma-separated: image,robot")
    parser.add_argument("--systems", help="comma-separated subset of the systems (default: all)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    preset = dict(QUICK if args.quick else FULL)
    for key in ("images", "episodes", "max_seconds", "min_warm_seconds"):
        if getattr(args, key) is not None:
            preset[key] = getattr(args, key)
    for key in ("cold_repeats", "warm_repeats"):
        if getattr(args, key) is not None:
            preset[key] = getattr(args, key)
    corpora = [c.strip() for c in args.corpora.split(",") if c.strip()]
    wanted = None if not args.systems else {s.strip() for s in args.systems.split(",")}
    known = set(SYSTEMS["image"]) | set(SYSTEMS["robot"]) | {"cat"}
    if set(corpora) - set(SYSTEMS) or (wanted and wanted - known):
        parser.error(f"--corpora from {sorted(SYSTEMS)}; --systems from {sorted(known)}")
    if preset["images"] < BATCH or preset["episodes"] < 1 or preset["cold_repeats"] < 1:
        parser.error("need --images >= 256, --episodes >= 1, --cold-repeats >= 1")

    missing = check_peers()
    if missing:
        print(
            "bench_load: error: peer packages missing or broken: " + ", ".join(missing) + "\n"
            "  run it through scripts/bench_load.sh (it creates .venv-bench with "
            "shardfeed[beam,bench]), or pip install webdataset mosaicml-streaming torch",
            file=sys.stderr,
        )
        return 2
    work = Path(args.work)
    if not work.is_absolute():
        work = REPO / work
    work.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    gen_started = time.perf_counter()
    roots, generated = {}, {}
    for corpus in corpora:
        size = preset["images"] if corpus == "image" else preset["episodes"]
        roots[corpus] = corpus_dir(work, corpus, size, args.seed)
        generated[corpus] = ensure_copies(roots[corpus], corpus, size, args.seed)
    gen_seconds = time.perf_counter() - gen_started
    reused = all(m["reused"] for g in generated.values() for m in g.values())

    load_before = os.getloadavg()[0]
    bench = Bench(args, preset)
    try:
        counts = run_all(bench, corpora, roots, wanted)
    finally:
        bench.close()
    total = time.perf_counter() - started
    load = (load_before, os.getloadavg()[0])
    return report(bench, args, preset, corpora, counts, total, gen_seconds, reused, load)


def run_all(bench: Bench, corpora: list[str], roots: dict, wanted: set | None) -> dict[str, int]:
    """Every run of every system on every corpus, printed as it goes; returns sample counts."""
    preset = bench.preset
    counts = {}
    for corpus in corpora:
        from shardfeed import open_dataset

        with open_dataset(roots[corpus] / "shardfeed") as ds:
            counts[corpus] = bench.samples[corpus] = len(ds)
        systems = [s for s in SYSTEMS[corpus] if wanted is None or s in wanted]
        if "shardfeed" not in systems and "shardfeed-bytes" not in systems:
            systems.append("shardfeed")
        sizes = {
            s: sum(os.path.getsize(p) for p in files_under(roots[corpus] / COPY_DIRS[s]))
            for s in systems
        }
        print(
            f"\n{corpus} corpus: {counts[corpus]:,} samples in {roots[corpus]} ("
            + ", ".join(f"{s} {sizes[s] / 1e6:.0f} MB" for s in systems)
            + ")",
            flush=True,
        )
        modes = [("cold", r) for r in range(preset["cold_repeats"])]
        modes += [("warm", r) for r in range(preset["warm_repeats"])]
        contenders = [*systems, "cat"] if wanted is None or "cat" in wanted else systems
        for mode, r in modes:
            # rotate the order each round and reverse it every other round, so no contender
            # always goes first or always follows the same one
            shift = r % len(contenders)
            order = contenders[shift:] + contenders[:shift]
            for system in order[::-1] if r % 2 else order:
                if system == "cat":
                    result = bench.measure_cat(corpus, roots[corpus], mode, counts[corpus])
                    what = f"{result['seconds']:.2f} s"
                else:
                    result = bench.measure(corpus, system, roots[corpus], mode)
                    what = f"{result['samples']:,} samples, {result['seconds']:.2f} s"
                    if result["cut"]:
                        what += ", cut off"
                    if result["max_batch_wait_s"] > STALL_S:
                        what += f"; STALL: one batch took {result['max_batch_wait_s']:.2f} s"
                print(
                    f"  {mode} run {r + 1}: {LABELS[system]:<26} "
                    f"{result['samples_per_s']:>10,.0f} samples/s "
                    f"{result['bytes_per_s'] / 1e6:>7.0f} MB/s  ({what})",
                    flush=True,
                )
        print()
        print(fmt_table(bench, corpus, systems))
    return counts


def report(
    bench: Bench,
    args: argparse.Namespace,
    preset: dict,
    corpora: list[str],
    counts: dict[str, int],
    total: float,
    gen_seconds: float,
    reused: bool,
    load: tuple[float, float],
) -> int:
    """The notes, the targets and the last line of JSON."""
    print()
    print(
        f"{os.cpu_count()} CPUs; batches of {BATCH}; no decode; the consumer touches one byte per "
        f"4 KiB page of every buffer. Cold: posix_fadvise(DONTNEED) on every file of the copy "
        f"first, one pass (cut off after {preset['max_seconds']:g} s), best of "
        f"{preset['cold_repeats']}. Warm: files read once first, passes for >= "
        f"{preset['min_warm_seconds']:g} s, best of {preset['warm_repeats']}. Peers run in-process "
        f"without DataLoader workers; per-file reads in random order, others in storage order. "
        f"Each contender reads its own copy (the host may cache the disk below this VM). "
        f"CPU % = CPU seconds of the reading process (all threads) over wall seconds."
    )
    if args.quick:
        print(
            f"QUICK run: {preset['images']:,} images (the full run uses {FULL['images']:,}), "
            f"{preset['episodes']} robot episodes (full {FULL['episodes']})."
        )
    print(
        "corpora: "
        + ("reused" if reused else f"generated (or partly) in {gen_seconds:.1f} s, not timed")
        + f"; measurements took {total - gen_seconds:.1f} s; 1-min load average "
        f"{load[0]:.2f} before, {load[1]:.2f} after (other work on this machine skews figures)"
    )
    for corpus in corpora:
        best = bench.best(corpus, "shardfeed", "cold")
        if best and best.get("loader_metrics"):
            print(f"ShardLoader.metrics() ({corpus}, best cold run): {best['loader_metrics']}")

    summary: dict = {}
    if "image" in corpora:
        summary.update(ratios(bench, "image", "cold"))
        summary["warm"] = ratios(bench, "image", "warm")
        summary["cold_round1"] = ratios(bench, "image", "cold", first=True)
        summary["bytes_copies"] = {
            "cold": ratios(bench, "image", "cold", "shardfeed-bytes"),
            "warm": ratios(bench, "image", "warm", "shardfeed-bytes"),
        }
        print(fmt_targets("image, cold (headline)", summary))
        print(fmt_targets("image, cold, round 1 only", summary["cold_round1"]))
        print(fmt_targets("image, warm", summary["warm"]))
        print(fmt_targets("image, cold, bytes copies", summary["bytes_copies"]["cold"]))
    if "robot" in corpora:
        robot = ratios(bench, "robot", "cold")
        robot["warm"] = ratios(bench, "robot", "warm")
        robot["cold_round1"] = ratios(bench, "robot", "cold", first=True)
        summary["robot"] = robot
        print(fmt_targets("robot, cold", robot))
        print(fmt_targets("robot, warm", robot["warm"]))
    rates = {
        corpus: {
            mode: {
                system: round(r)
                for system in [*SYSTEMS[corpus], "cat"]
                if (r := bench.rate(corpus, system, mode)) is not None
            }
            for mode in ("cold", "warm")
        }
        for corpus in corpora
    }
    summary.update(
        {
            "samples_per_s": rates,
            "samples": counts,
            "seconds": round(total - gen_seconds, 1),
            "generate_seconds": round(gen_seconds, 1),
            "cold": f"best of {preset['cold_repeats']}",
            "warm_runs": f"best of {preset['warm_repeats']}",
            "quick": args.quick,
            "loader": "ShardLoader",
            "date": datetime.date.today().isoformat(),
            "cpus": os.cpu_count(),
            "loadavg": [round(x, 2) for x in load],
        }
    )
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
