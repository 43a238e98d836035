#!/usr/bin/env bash
# Conversion benchmark, one command: shardfeed convert vs WebDataset ShardWriter, MDSWriter and cp -r.
#
#   bash scripts/bench_convert.sh --quick     # ~3,000 files / ~60 MB, a few minutes at most
#   bash scripts/bench_convert.sh             # full size: >= 20,000 files, >= 500 MB
#   bash scripts/bench_convert.sh --help      # every option of scripts/bench_convert.py
#
# Creates or reuses .venv-bench (scripts/bench_venv.sh: torch CPU first, then shardfeed[beam,bench]).
# The last line printed is a JSON object: {"vs_best_peer": x, "vs_copy": y, "samples_per_s": z, ...}.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# shellcheck source=scripts/bench_venv.sh
source scripts/bench_venv.sh

exec "$VENV/bin/python" scripts/bench_convert.py "$@"
