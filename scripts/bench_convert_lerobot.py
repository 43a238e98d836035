#!/usr/bin/env python3
"""The LeRobot kind of the conversion benchmark (``bench_convert.py --kind lerobot``).

One generated LeRobot v2.1 dataset (240 episodes of 100-400 frames at 30 fps, one Parquet file
per episode: ``observation.state`` and ``action`` float32[6], timestamps, indices, three tasks;
``meta/`` with ``info.json``, ``episodes.jsonl``, ``episodes_stats.jsonl``, ``tasks.jsonl``) is
converted to the v3.0 layout by:

=========  ==========================================================================================
sf-1w      ``shardfeed convert --from lerobot`` on the in-process runner, one thread (``sf-2t``: two
           threads, ``convert``'s default on 2 cores; ``sf-2w``: two multi_processing workers)
lerobot    LeRobot's own converter, ``convert_dataset_v21_to_v30.convert_dataset(..., root=...,
           push_to_hub=False)``, offline, in ``.venv-lerobot`` (made by
           ``scripts/test_lerobot_interop.sh``); it converts in place, so the process first copies
           the corpus and reports the conversion's own seconds (``work s``) apart from the copy
plain      a plain pyarrow rewrite: every episode file read, concatenated, written as zstd Parquet
           files of the same size as shardfeed's shards
=========  ==========================================================================================

Every output's frame count is checked (``shardfeed inspect --json``; LeRobot's and the plain
rewrite's ``info.json`` and Parquet footers). The headline ``vs_lerobot`` compares work seconds
(LeRobot's without the copy, shardfeed's without interpreter start), ``vs_lerobot_wall`` whole
commands (LeRobot's including the copy).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

import bench_convert as bc
import bench_convert_text as bct
from bench_convert_text import run_one, write_parts

REPO = Path(__file__).resolve().parent.parent
LEROBOT_VENV = REPO / ".venv-lerobot"
CORPUS_VERSION = 1
EPISODES, QUICK_EPISODES = 240, 60
FPS, DIM, SEED = 30, 6, 11
TASKS = ("pick up the cube", "open the drawer", "push the block left")
REPO_ID = "bench/robot"
CONTENDERS = ("sf-1w", "sf-2t", "sf-2w", "lerobot", "plain")


def make_corpus(root: Path, episodes: int) -> dict:
    """The v2.1 dataset at ``root`` (reused when the parameters match)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    params = {"version": CORPUS_VERSION, "episodes": episodes, "seed": SEED}
    stamp = root.parent / ".bench-corpus.json"
    if stamp.exists() and json.loads(stamp.read_text()).get("params") == params:
        return json.loads(stamp.read_text())
    shutil.rmtree(root.parent, ignore_errors=True)
    (root / "meta").mkdir(parents=True)
    rng = np.random.default_rng(SEED)
    lengths = rng.integers(100, 401, episodes)
    first = 0
    episodes_jsonl, stats_jsonl = [], []
    for e, n in enumerate(lengths.tolist()):
        state = rng.normal(size=(n, DIM)).astype(np.float32)
        action = rng.normal(size=(n, DIM)).astype(np.float32)
        task = e % len(TASKS)
        columns = {
            "observation.state": state,
            "action": action,
            "timestamp": (np.arange(n) / FPS).astype(np.float32),
            "frame_index": np.arange(n, dtype=np.int64),
            "episode_index": np.full(n, e, dtype=np.int64),
            "index": np.arange(first, first + n, dtype=np.int64),
            "task_index": np.full(n, task, dtype=np.int64),
        }
        table = pa.table(
            {
                k: pa.FixedSizeListArray.from_arrays(pa.array(v.reshape(-1)), DIM)
                if v.ndim == 2
                else pa.array(v)
                for k, v in columns.items()
            }
        )
        path = root / f"data/chunk-000/episode_{e:06d}.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, path)
        stats = {}
        for k, v in columns.items():
            v2 = v.reshape(n, -1).astype(np.float64)
            stats[k] = {
                "min": v2.min(0).tolist(),
                "max": v2.max(0).tolist(),
                "mean": v2.mean(0).tolist(),
                "std": v2.std(0).tolist(),
                "count": [n],
            }
        episodes_jsonl.append({"episode_index": e, "tasks": [TASKS[task]], "length": n})
        stats_jsonl.append({"episode_index": e, "stats": stats})
        first += n
    vector = {"dtype": "float32", "shape": [DIM], "names": [f"j{i}" for i in range(DIM)]}
    scalar = {"shape": [1], "names": None}
    info = {
        "codebase_version": "v2.1",
        "robot_type": "bench_arm",
        "total_episodes": episodes,
        "total_frames": first,
        "total_tasks": len(TASKS),
        "total_videos": 0,
        "total_chunks": 1,
        "chunks_size": 1000,
        "fps": FPS,
        "splits": {"train": f"0:{episodes}"},
        "data_path": "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet",
        "video_path": None,
        "features": {
            "observation.state": vector,
            "action": vector,
            "timestamp": {"dtype": "float32", **scalar},
            "frame_index": {"dtype": "int64", **scalar},
            "episode_index": {"dtype": "int64", **scalar},
            "index": {"dtype": "int64", **scalar},
            "task_index": {"dtype": "int64", **scalar},
        },
    }
    meta = root / "meta"
    (meta / "info.json").write_text(json.dumps(info, indent=2))
    (meta / "episodes.jsonl").write_text("".join(json.dumps(x) + "\n" for x in episodes_jsonl))
    (meta / "episodes_stats.jsonl").write_text("".join(json.dumps(x) + "\n" for x in stats_jsonl))
    (meta / "tasks.jsonl").write_text(
        "".join(json.dumps({"task_index": i, "task": t}) + "\n" for i, t in enumerate(TASKS))
    )
    info_out = {"params": params, "samples": first, "bytes": bc.tree_bytes(root)[1]}
    stamp.write_text(json.dumps(info_out))
    return info_out


def peer_lerobot(src: str, dst: str) -> dict:
    """Copy the v2.1 corpus under ``dst`` (not timed), then LeRobot's converter, offline."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("HF_HOME", os.path.join(dst, ".hf-home"))
    _declare_torchvision_ops()
    from lerobot.datasets.v30.convert_dataset_v21_to_v30 import convert_dataset

    target = Path(dst) / REPO_ID
    shutil.copytree(src, target)
    started = time.perf_counter()
    convert_dataset(repo_id=REPO_ID, root=dst, push_to_hub=False)
    work = time.perf_counter() - started
    shutil.rmtree(Path(dst) / f"{REPO_ID}_old")  # the v2.1 copy it keeps beside its output
    return {
        "work_s": work,
        "samples": json.loads((target / "meta/info.json").read_text())["total_frames"],
    }


def _declare_torchvision_ops() -> None:
    """PyPI's torchvision is built against CUDA torch; beside the CPU torch of .venv-lerobot its
    ops library does not load, and its import then dies registering fake kernels for the missing
    ``nms``/``qnms`` ops. Declaring their schemas lets the import through (the converter uses
    neither); ``tests/interop/lerobot_load.py`` explains it at length."""
    import importlib.util

    import torch

    spec = importlib.util.find_spec("torchvision")
    if spec is None or not spec.submodule_search_locations:
        return
    for library in Path(spec.submodule_search_locations[0]).glob("_C*.so"):
        try:
            torch.ops.load_library(str(library))
            return  # a torchvision that matches torch
        except OSError:
            break
    fragment = torch.library.Library("torchvision", "FRAGMENT")
    fragment.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    fragment.define("qnms(Tensor qdets, Tensor scores, float iou_threshold) -> Tensor")
    _declare_torchvision_ops.fragment = fragment  # type: ignore[attr-defined]  # keep it alive


def peer_plain(src: str, dst: str, shard_bytes: int) -> dict:
    """Every episode file read, concatenated, written as zstd Parquet files of ``shard_bytes``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    started = time.perf_counter()
    files = sorted(Path(src).glob("data/*/*.parquet"))
    table = pa.concat_tables(pq.read_table(f) for f in files)
    write_parts(table, dst, max(1, round(table.nbytes / shard_bytes)))
    return {"work_s": time.perf_counter() - started, "samples": table.num_rows}


def count_output(name: str, dst: Path) -> tuple[int, dict]:
    if name.startswith("sf-"):
        inspected = bc.inspect_json(dst)
        return inspected["num_samples"], {"shards": inspected["num_shards"]}
    import pyarrow.parquet as pq

    root = dst / REPO_ID if name == "lerobot" else dst
    files = sorted(root.glob("data/*/*.parquet") if name == "lerobot" else root.glob("*.parquet"))
    return sum(pq.ParquetFile(f).metadata.num_rows for f in files), {"shards": len(files)}


def run_kind(
    workdir: Path, quick: bool, names: list[str] | None, timeout: float, drop: bool
) -> dict:
    """Generate (or reuse) the corpus, run the contenders, print the table, return the block."""
    corpus = workdir / "lerobot-corpus" / "robot"
    info = make_corpus(corpus, QUICK_EPISODES if quick else EPISODES)
    samples, in_bytes = info["samples"], info["bytes"]
    target = max(1, in_bytes // 4)
    out, logs = workdir / "outputs" / "lerobot", workdir / "logs" / "lerobot"
    out.mkdir(parents=True, exist_ok=True)
    logs.mkdir(parents=True, exist_ok=True)
    can_drop = drop and bc.drop_caches()
    me = str(Path(__file__).resolve())
    chosen = [n for n in (names or CONTENDERS) if n in CONTENDERS]
    results, notes = [], []
    for name in chosen:
        dst = out / name
        if name.startswith("sf-"):
            cmd = [sys.executable, "-m", "shardfeed.cli.main", "convert", str(corpus), str(dst)]
            cmd += ["--from", "lerobot", "--target-shard-size", str(target), "--json"]
            cmd += bct.MODES[name.removeprefix("sf-")]
            warm = "import apache_beam, shardfeed.cli.main, shardfeed.pipelines.driver"
        elif name == "lerobot":
            python = LEROBOT_VENV / "bin" / "python"
            if not python.exists():
                notes.append(
                    "lerobot: not run: .venv-lerobot is missing (bash scripts/test_lerobot_interop.sh "
                    "makes it)"
                )
                continue
            cmd = [str(python), me, "_lerobot", str(corpus), str(dst)]
            warm = ""
        else:
            cmd = [sys.executable, me, "_plain", str(corpus), str(dst), str(target)]
            warm = "import pyarrow.parquet"
        results.append(
            run_one(name, cmd, warm, dst, logs, samples, timeout, can_drop, count_output)
        )
    print()
    print(
        f"kind lerobot: {samples:,} frames in {info['params']['episodes']} episodes, "
        f"{in_bytes / 1e6:.1f} MB of v2.1 Parquet; page cache "
        + ("dropped before each contender" if can_drop else "NOT dropped")
    )
    print(bc.fmt_table(results, samples, in_bytes))
    for note in notes:
        print(note)
    by = {r.name: r for r in results}
    block: dict = {}
    best = min((n for n in bct.SF_RUNS if n in by), key=lambda n: by[n].wall_s, default=None)
    if best and "lerobot" in by:
        block["vs_lerobot"] = round(by["lerobot"].work_s / by[best].work_s, 3)
        block["vs_lerobot_wall"] = round(by["lerobot"].wall_s / by[best].wall_s, 3)
    if best and "plain" in by:
        block["vs_plain"] = round(by["plain"].wall_s / by[best].wall_s, 3)
    for mode in ("2w", "2t"):
        if "sf-1w" in by and f"sf-{mode}" in by:
            block[f"scale_{mode}"] = round(by["sf-1w"].wall_s / by[f"sf-{mode}"].wall_s, 3)
    block["frames_per_s"] = {r.name: round(samples / r.wall_s, 1) for r in results}
    block["work_s"] = {r.name: r.work_s and round(r.work_s, 3) for r in results}
    if notes:
        block["notes"] = notes
    return block


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_lerobot":
        print(json.dumps(peer_lerobot(sys.argv[2], sys.argv[3])), flush=True)
        sys.exit(0)
    if len(sys.argv) > 1 and sys.argv[1] == "_plain":
        print(json.dumps(peer_plain(sys.argv[2], sys.argv[3], int(sys.argv[4]))), flush=True)
        sys.exit(0)
    sys.exit("run through scripts/bench_convert.sh --kind lerobot")
