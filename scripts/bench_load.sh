#!/usr/bin/env bash
# Loading benchmark, one command: shardfeed's ShardLoader against one-file-per-sample (random order),
# WebDataset, MosaicML Streaming (MDS), LeRobot v2.1 per-episode Parquet and `cat` of the shard bytes,
# on a generated image corpus (~20 KB JPEGs + label) and a robot corpus (float32 state/action),
# from a cold (posix_fadvise DONTNEED) and a warm page cache; batches of 256, no decode.
#
#   bash scripts/bench_load.sh --quick     # 20k images, 100 episodes: under 3 minutes
#   bash scripts/bench_load.sh             # full size: 50k images (~1 GB), 400 episodes; minutes
#   bash scripts/bench_load.sh --help      # every option of scripts/bench_load.py
#
# Creates or reuses .venv-bench (scripts/bench_venv.sh: torch CPU first, then shardfeed[beam,bench]).
# Corpora are kept in out/bench_load (--work DIR) and reused by later runs with the same parameters.
# The last line printed is a JSON object: {"vs_per_file": a, "vs_best_peer": b, "vs_raw_read": c,
# "warm": {...}, "robot": {...}, ...} (top level: cold page cache, image corpus).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# shellcheck source=scripts/bench_venv.sh
source scripts/bench_venv.sh

exec "$VENV/bin/python" scripts/bench_load.py "$@"
