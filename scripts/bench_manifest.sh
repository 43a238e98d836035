#!/usr/bin/env bash
# Manifest loading benchmark, one command: Manifest.loads of a 20,000-shard manifest against
# json.loads of the same text (target: at most 2x), a few seconds.
#
#   bash scripts/bench_manifest.sh               # 20,000 shards, best of 7
#   bash scripts/bench_manifest.sh --shards 100000
#
# Creates or reuses .venv-bench (scripts/bench_venv.sh). The last line printed is one JSON object:
# {"shards": n, "json_s": a, "loads_s": b, "ratio": b / a, "record_by_record_s": c}.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# shellcheck source=scripts/bench_venv.sh
source scripts/bench_venv.sh

exec "$VENV/bin/python" scripts/bench_manifest.py "$@"
