#!/usr/bin/env python3
"""Staging benchmark: ``shardfeed stage`` against ``cp -r`` and ``rclone copy --checksum``.

One real shardfeed dataset (a manifest with every file's sha256, so staging can verify) is generated
once: shards of incompressible random bytes in an ``image`` column (stored as given), so the shard
files are as large as their payload. It is then copied to a local directory three ways, side by side:

==========  =====================================================================================
cp          ``cp -r SRC DST``: no verification, no fsync; the floor a verified copy can approach
rclone      ``rclone copy --checksum --transfers 4 SRC DST`` (Debian's rclone, installed with
            apt-get when missing): hashes source and copy (MD5) and compares them; no fsync
shardfeed   ``shardfeed stage SRC --tiers T.toml --workers 4 --json``: every file to a temporary
            name, sha256 while copying, fsync, checked against the manifest, renamed, directory
            fsynced; the manifest last; then ``meta/shardfeed/locations.json`` is written
==========  =====================================================================================

How each run is measured
------------------------
- Runs are interleaved: round r runs every contender once, the order rotated each round so no
  contender always goes first. The target is wiped (and the source's ``locations.json`` from the
  previous stage removed, so every contender copies the same files) before each run.
- Before each run: ``sync`` and ``echo 3 > /proc/sys/vm/drop_caches`` when allowed (the output says
  whether caches were dropped), then the contender's code is warmed (``rclone version``, or the
  shardfeed imports in a throw-away process), so each reads the *data* cold but its *code* warm.
- ``s`` is the wall time of the whole command, interpreter start and imports included (what a
  user waits for). For shardfeed the table also gives its own copy time (``seconds`` in its JSON)
  and the median of ``shardfeed stage --dry-run`` (start, imports, reading the manifest, planning).
- ``sync s`` is a ``sync`` run right after the command exits (not in ``s``), with the dirty page
  cache it found: the cost cp and rclone leave behind by not fsyncing. shardfeed's is ~0.
  ``vs_cp_durable`` / ``vs_rclone_durable`` (context, not the targets) compare command + sync.
- Every copy is checked outside the timing: cp and rclone by file count and bytes, shardfeed by
  ``shardfeed verify`` on the tier copy (exit 0). A failed check fails the benchmark.

The last line printed is JSON ``{"vs_cp": x, "vs_rclone": y, ...}``: the median cp (rclone) seconds
over the median shardfeed seconds; higher is better for shardfeed. Targets: ``vs_rclone >= 1.0``,
``vs_cp >= 0.5``. ``vs_rclone`` is null when rclone could not be installed.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_convert import drop_caches, tree_bytes

from shardfeed.schemas.units import parse_size

DATASET_VERSION = 1
DATASET_NAME = "bench-stage"
ROW_BYTES = 1 << 20  # one sample: 1 MiB of random bytes

FULL = {"size": "1GB", "shard": "100MB", "repeat": 3}
QUICK = {"size": "200MB", "shard": "50MB", "repeat": 3}
CONTENDERS = ("cp", "rclone", "shardfeed")
TIERS_TOML = """\
[tiers.pfs]
path = "{root}/{{dataset}}"
scope = "shared"
capacity = "100TB"
read_bandwidth = "2GB/s"

[policy]
hot = []
all = ["pfs"]
"""


# --------------------------------------------------------------------------------------------------
# Dataset
# --------------------------------------------------------------------------------------------------


def make_dataset(root: Path, size: int, shard: int, seed: int) -> dict:
    """Write (or reuse) a shardfeed dataset of ``size`` payload bytes in ~``shard``-byte shards."""
    import numpy as np
    import pyarrow as pa

    from shardfeed.formats.dataset_writer import DatasetWriter
    from shardfeed.schemas.features import IMAGE_ARROW_TYPE

    params = {"version": DATASET_VERSION, "size": size, "shard": shard, "seed": seed}
    stamp = root.parent / f".{root.name}.bench-stage.json"
    manifest = root / "meta/shardfeed/manifest.json"
    if stamp.exists() and manifest.exists() and json.loads(stamp.read_text()) == params:
        return {"reused": True, "seconds": 0.0}
    started = time.perf_counter()
    stamp.unlink(missing_ok=True)
    shutil.rmtree(root, ignore_errors=True)
    rng = np.random.default_rng(seed)
    rows = max(1, math.ceil(size / ROW_BYTES))
    shards = max(1, round(size / shard))
    cuts = [rows * i // shards for i in range(shards + 1)]
    writer = DatasetWriter(
        str(root),
        {"blob": {"dtype": "image", "shape": []}, "id": {"dtype": "int64", "shape": [1]}},
        target_shard_bytes=shard,
        cost="bytes",
        source="scripts/bench_stage.py: random bytes",
    )
    for a, b in itertools.pairwise(cuts):
        n = b - a
        data = pa.py_buffer(rng.bytes(n * ROW_BYTES))
        offsets = pa.py_buffer(np.arange(0, (n + 1) * ROW_BYTES, ROW_BYTES, dtype=np.int32))
        blob = pa.Array.from_buffers(pa.binary(), n, [None, offsets, data])
        images = pa.StructArray.from_arrays(
            [blob, pa.nulls(n, pa.string())], fields=list(IMAGE_ARROW_TYPE)
        )
        ids = pa.array(np.arange(a, b, dtype=np.int64))
        writer.add_shard(pa.table({"blob": images, "id": ids}))
    writer.finalize()
    stamp.write_text(json.dumps(params))
    return {"reused": False, "seconds": time.perf_counter() - started}


# --------------------------------------------------------------------------------------------------
# rclone
# --------------------------------------------------------------------------------------------------


def ensure_rclone(install: bool) -> tuple[str | None, str]:
    """The rclone binary and its version line, installing Debian's package if missing; else
    (None, why)."""
    path = shutil.which("rclone")
    if path is None and install:
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        cmd = ["apt-get", "install", "-y", "-q", "--no-install-recommends", "rclone"]
        print("bench_stage: rclone missing; apt-get install -y rclone ...", file=sys.stderr)
        try:
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=150)
            if done.returncode != 0:  # stale package lists: refresh once and retry
                subprocess.run(
                    ["apt-get", "update", "-q"], env=env, capture_output=True, timeout=120
                )
                done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=150)
            if done.returncode != 0:
                tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or [""]
                return None, f"apt-get install rclone failed (exit {done.returncode}): {tail[0]}"
        except (OSError, subprocess.TimeoutExpired) as err:
            return None, f"apt-get install rclone failed: {err}"
        path = shutil.which("rclone")
    if path is None:
        return None, "rclone is not installed" + ("" if install else " (--no-install)")
    version = subprocess.run([path, "version"], capture_output=True, text=True, check=False)
    return path, (version.stdout.splitlines() or ["rclone ?"])[0].strip()


# --------------------------------------------------------------------------------------------------
# Runs
# --------------------------------------------------------------------------------------------------


def dirty_bytes() -> int:
    """Dirty + Writeback pages of the page cache (/proc/meminfo), in bytes."""
    total = 0
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in ("Dirty", "Writeback"):
                    total += int(value.split()[0]) * 1024
    except OSError:
        return -1
    return total


def shardfeed_cmd(*args: str) -> list[str]:
    script = Path(sys.executable).parent / "shardfeed"
    if script.exists():
        return [str(script), *args]
    return [sys.executable, "-c", "from shardfeed.cli.main import main; main()", *args]


class Bench:
    def __init__(self, args: argparse.Namespace, src: Path, out: Path, rclone: str | None) -> None:
        self.args = args
        self.src = src
        self.out = out
        self.rclone = rclone
        self.tiers = out / "tiers.toml"
        self.tiers.write_text(TIERS_TOML.format(root=out / "shardfeed"))
        self.locations = src / "meta/shardfeed/locations.json"  # written by each stage
        self.locations.unlink(missing_ok=True)
        self.files, self.bytes = tree_bytes(src)
        self.dropped: list[bool] = []
        self.runs: dict[str, list[dict]] = {}

    @property
    def caches_dropped(self) -> bool:
        """Whether the page cache was dropped before every run."""
        return bool(self.dropped) and all(self.dropped)

    def target(self, name: str) -> Path:
        return self.out / name / DATASET_NAME

    def command(self, name: str) -> list[str]:
        dst = self.target(name)
        if name == "cp":
            return ["cp", "-r", str(self.src), str(dst)]
        if name == "rclone":
            return [
                self.rclone,
                "copy",
                "--checksum",
                "--transfers",
                str(self.args.transfers),
                str(self.src),
                str(dst),
            ]
        return shardfeed_cmd(
            "stage",
            str(self.src),
            "--tiers",
            str(self.tiers),
            "--workers",
            str(self.args.workers),
            "--json",
        )

    def reset(self, name: str) -> None:
        shutil.rmtree(self.out / name, ignore_errors=True)
        self.locations.unlink(missing_ok=True)
        (self.out / name).mkdir(parents=True)
        if self.args.no_drop_caches:
            subprocess.run(["sync"], check=False)
            self.dropped.append(False)
        else:
            self.dropped.append(drop_caches())
        if name == "rclone":
            subprocess.run([self.rclone, "version"], capture_output=True, check=False)
        elif name == "shardfeed":
            warm = "import shardfeed.cli.main, shardfeed.staging, shardfeed.cli.stage_cmd"
            subprocess.run([sys.executable, "-c", warm], check=True)

    def check(self, name: str, stdout: str) -> dict:
        """Outside the timing: the copy is whole."""
        dst = self.target(name)
        if name == "shardfeed":
            done = subprocess.run(
                shardfeed_cmd("verify", str(dst)), capture_output=True, text=True, check=False
            )
            if done.returncode != 0:
                raise SystemExit(
                    f"shardfeed verify {dst} exited {done.returncode}:\n{done.stdout}{done.stderr}"
                )
            report = json.loads(stdout)
            return {"work_s": sum(r["seconds"] for r in report["results"])}
        files, size = tree_bytes(dst)
        if (files, size) != (self.files, self.bytes):
            raise SystemExit(
                f"{name}: copied {files} files / {size} bytes, expected {self.files} / {self.bytes}"
            )
        return {}

    def run(self, name: str) -> dict:
        self.reset(name)
        cmd = self.command(name)
        started = time.perf_counter()
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        seconds = time.perf_counter() - started
        if done.returncode != 0:
            raise SystemExit(
                f"{name}: {' '.join(cmd)} exited {done.returncode}:\n{done.stdout}{done.stderr}"
            )
        dirty = dirty_bytes()
        started = time.perf_counter()
        subprocess.run(["sync"], check=False)
        result = {
            "s": seconds,
            "sync_s": time.perf_counter() - started,
            "durable_s": seconds + time.perf_counter() - started,
            "dirty_mb": dirty / 1e6,
            **self.check(name, done.stdout),
        }
        self.runs.setdefault(name, []).append(result)
        return result

    def dry_run_seconds(self) -> float:
        """Median wall time of ``shardfeed stage --dry-run``: start, imports, manifest, plan."""
        times = []
        for _ in range(3):
            cmd = shardfeed_cmd("stage", str(self.src), "--tiers", str(self.tiers), "--dry-run")
            started = time.perf_counter()
            subprocess.run(cmd, capture_output=True, check=True)
            times.append(time.perf_counter() - started)
        return statistics.median(times)

    def median(self, name: str, key: str = "s") -> float | None:
        runs = self.runs.get(name)
        return statistics.median(r[key] for r in runs) if runs else None


def fmt_table(bench: Bench, names: list[str], repeat: int) -> str:
    mb = bench.bytes / 1e6
    head = (
        f"{'contender':<10}"
        + "".join(f"{f'run{i + 1} s':>9}" for i in range(repeat))
        + f"{'median s':>10}{'MB/s':>8}{'sync s':>8}{'dirty MB':>10}"
    )
    lines = [head, "-" * len(head)]
    for name in names:
        runs = bench.runs[name]
        med = bench.median(name)
        lines.append(
            f"{name:<10}"
            + "".join(f"{r['s']:>9.2f}" for r in runs)
            + f"{med:>10.2f}{mb / med:>8.0f}{bench.median(name, 'sync_s'):>8.2f}"
            + f"{bench.median(name, 'dirty_mb'):>10.0f}"
        )
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------------


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Stage a generated dataset with shardfeed, cp -r and rclone copy --checksum.",
        epilog="The last line printed is JSON: {'vs_cp': x, 'vs_rclone': y, ...}.",
    )
    parser.add_argument("--quick", action="store_true", help="200MB in 50MB shards (< 3 min)")
    parser.add_argument("--size", help="dataset payload (default 1GB; 200MB with --quick)")
    parser.add_argument("--shard-size", help="shard payload (default 100MB; 50MB with --quick)")
    parser.add_argument("--repeat", type=int, help="runs per contender (default 3)")
    parser.add_argument("--workers", type=int, default=4, help="shardfeed stage --workers")
    parser.add_argument("--transfers", type=int, default=4, help="rclone --transfers")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--workdir", help="keep the dataset here and reuse it (default: a temp dir, removed)"
    )
    parser.add_argument(
        "--contenders",
        default=",".join(CONTENDERS),
        help=f"comma-separated subset of {','.join(CONTENDERS)}",
    )
    parser.add_argument("--no-drop-caches", action="store_true", help="only sync between runs")
    parser.add_argument(
        "--no-install", action="store_true", help="do not apt-get install a missing rclone"
    )
    args = parser.parse_args(argv)
    preset = QUICK if args.quick else FULL
    size = parse_size(args.size or preset["size"])
    shard = parse_size(args.shard_size or preset["shard"])
    repeat = args.repeat or preset["repeat"]
    names = [n.strip() for n in args.contenders.split(",") if n.strip()]
    unknown = set(names) - set(CONTENDERS)
    if unknown or repeat < 1 or size <= 0 or shard <= 0:
        parser.error(f"bad --contenders {sorted(unknown)}, --repeat, --size or --shard-size")

    rclone_note = "not run (--contenders)"
    rclone = None
    if "rclone" in names:
        rclone, rclone_note = ensure_rclone(not args.no_install)
        if rclone is None:
            names.remove("rclone")
            print(f"bench_stage: rclone unavailable: {rclone_note}; vs_rclone will be null")

    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="bench-stage-"))
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        src = workdir / "src" / DATASET_NAME
        src.parent.mkdir(parents=True, exist_ok=True)
        made = make_dataset(src, size, shard, args.seed)
        out = workdir / "dst"
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir()
        bench = Bench(args, src, out, rclone)
        print(
            f"dataset: {src} ({bench.files} files, {bench.bytes / 1e6:.1f} MB; "
            + ("reused" if made["reused"] else f"generated in {made['seconds']:.1f} s")
            + f"); {os.cpu_count()} CPUs; {repeat} run{'s' if repeat != 1 else ''} each, interleaved"
        )
        for r in range(repeat):
            shift = r % len(names)
            for name in names[shift:] + names[:shift]:
                result = bench.run(name)
                print(f"  round {r + 1}: {name:<10} {result['s']:6.2f} s", flush=True)

        print()
        print(fmt_table(bench, names, repeat))
        startup = None
        if "shardfeed" in names:
            startup = bench.dry_run_seconds()
            work = bench.median("shardfeed", "work_s")
            print(
                f"shardfeed: copy {work:.2f} s inside the command (its JSON 'seconds'); "
                f"start + imports + plan (stage --dry-run) {startup:.2f} s; "
                f"--workers {args.workers}; every run passed shardfeed verify"
            )
        if rclone:
            print(f"rclone: {rclone_note}, --transfers {args.transfers}; verifies by MD5, no fsync")
        elif "rclone" in args.contenders:
            print(f"rclone: unavailable ({rclone_note})")
        print(
            "page cache: "
            + (
                "dropped before each run (sync; echo 3 > /proc/sys/vm/drop_caches), code re-warmed"
                if bench.caches_dropped
                else "NOT dropped (not permitted or --no-drop-caches); sync before each run"
            )
        )
        cp_s, rc_s, sf_s = (bench.median(n) for n in CONTENDERS)
        vs_cp, vs_rclone = ratio(cp_s, sf_s), ratio(rc_s, sf_s)
        # cp and rclone with the dirty pages they leave flushed (command + sync), for context
        cp_durable, rc_durable, sf_durable = (bench.median(n, "durable_s") for n in CONTENDERS)
        if cp_durable is not None and sf_durable:
            print(
                f"durable (command + sync): cp {cp_durable:.2f} s, "
                + (f"rclone {rc_durable:.2f} s, " if rc_durable is not None else "")
                + f"shardfeed {sf_durable:.2f} s; vs_cp_durable = "
                f"{cp_durable / sf_durable:.3f} (context, not the target)"
            )
        for label, value, target in (("vs_rclone", vs_rclone, 1.0), ("vs_cp", vs_cp, 0.5)):
            if value is not None:
                verdict = "meets" if value >= target else "MISSES"
                print(f"{label} = {value:.3f} {verdict} its target >= {target}")
        summary = {
            "vs_cp": vs_cp,
            "vs_rclone": vs_rclone,
            "vs_cp_durable": ratio(cp_durable, sf_durable),
            "vs_rclone_durable": ratio(rc_durable, sf_durable),
            "cp_s": cp_s and round(cp_s, 3),
            "rclone_s": rc_s and round(rc_s, 3),
            "shardfeed_s": sf_s and round(sf_s, 3),
            "shardfeed_copy_s": bench.median("shardfeed", "work_s"),
            "shardfeed_startup_s": startup and round(startup, 3),
            "bytes": bench.bytes,
            "files": bench.files,
            "repeats": repeat,
            "caches_dropped": bench.caches_dropped,
            "quick": args.quick,
            "rclone": rclone_note,
        }
        print(json.dumps(summary))
        return 0
    finally:
        if args.workdir:  # keep the dataset for the next run, not the copies
            shutil.rmtree(workdir / "dst", ignore_errors=True)
            (workdir / "src" / DATASET_NAME / "meta/shardfeed/locations.json").unlink(
                missing_ok=True
            )
        else:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
