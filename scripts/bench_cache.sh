#!/usr/bin/env bash
# Node-cache benchmark, one command: hot-index pinning vs no cache, sample-level LRU and shard-level
# LRU on a replayed Zipf(1.0) sampling trace (a pure numpy simulation, no I/O).
#
#   bash scripts/bench_cache.sh             # full size: 200k samples, 3 epochs, 8 nodes, a few seconds
#   bash scripts/bench_cache.sh --quick     # 50k samples
#   bash scripts/bench_cache.sh --help      # every option of scripts/bench_cache.py
#
# Uses .venv when it exists (scripts/test.sh creates it); otherwise creates it with the core install
# (pip install -e .), which is all this benchmark needs. Set BENCH_VENV to use another venv.
# The last line printed is a JSON object: {"saved_vs_nocache": f, "vs_lru": r, "staging_gb": g, ...}.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

CORE_CHECK="import numpy, shardfeed.planning.hot"
# shellcheck source=scripts/core_venv.sh
source scripts/core_venv.sh

exec "$VENV/bin/python" scripts/bench_cache.py "$@"
