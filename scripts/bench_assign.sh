#!/usr/bin/env bash
# Rank-assignment planning benchmark, one command: shardfeed.assignment.assign vs MosaicML Streaming's
# runtime planning (get_partitions('orig') + get_shuffle('py1e')) for the same world and epochs.
#
#   bash scripts/bench_assign.sh --quick     # 1M samples / 1k shards / 16 nodes, well under a minute
#   bash scripts/bench_assign.sh             # full size: 10M samples / 10k shards / 128x8x8, 2 epochs
#   bash scripts/bench_assign.sh --help      # every option of scripts/bench_assign.py
#
# Creates or reuses .venv-bench (scripts/bench_venv.sh: torch CPU first, then shardfeed[beam,bench]).
# The last line printed is a JSON object: {"seconds": s, "peak_rss_mb": m, "output_mb": o, "vs_streaming": r, ...}.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# shellcheck source=scripts/bench_venv.sh
source scripts/bench_venv.sh

exec "$VENV/bin/python" scripts/bench_assign.py "$@"
