#!/usr/bin/env bash
# Conversion benchmark, one command: shardfeed convert against its peers, side by side.
#
#   bash scripts/bench_convert.sh --quick     # images: ~3,000 files / ~60 MB, a few minutes at most
#   bash scripts/bench_convert.sh             # images, full size: >= 20,000 files, >= 500 MB
#   bash scripts/bench_convert.sh --kind text       # 100,000 JSONL documents (~140 MB): HF datasets,
#                                                    # MDSWriter, a plain pyarrow pass
#   bash scripts/bench_convert.sh --kind text-gz    # the same as .jsonl.gz/.zst, 4 and 64 shards
#   bash scripts/bench_convert.sh --kind parquet    # the same as Parquet files
#   bash scripts/bench_convert.sh --kind all        # every kind in turn (--quick for each)
#   bash scripts/bench_convert.sh --help      # every option of scripts/bench_convert.py
#
# Creates or reuses .venv-bench (scripts/bench_venv.sh: torch CPU first, then shardfeed[beam,bench]).
# The last line printed is one JSON object with a block per kind: {"image": {"vs_best_peer": x, ...}, ...}.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# shellcheck source=scripts/bench_venv.sh
source scripts/bench_venv.sh

exec "$VENV/bin/python" scripts/bench_convert.py "$@"
