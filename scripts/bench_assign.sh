#!/usr/bin/env bash
# Rank-assignment planning benchmark, one command: shardfeed.assignment.assign vs MosaicML Streaming's
# runtime planning (get_partitions('orig') + get_shuffle('py1e')) for the same world and epochs.
#
#   bash scripts/bench_assign.sh --quick     # 1M samples / 1k shards / 16 nodes, well under a minute
#   bash scripts/bench_assign.sh             # full size: 10M samples / 10k shards / 128x8x8, 2 epochs
#   bash scripts/bench_assign.sh --help      # every option of scripts/bench_assign.py
#
# Creates or reuses .venv-bench (git-ignored, shared with bench_convert.sh) the same way bench_convert.sh
# does: torch first at an exact version (the CPU wheel this machine has on disk; mosaicml-streaming needs
# torch), then -e .[bench]. Set BENCH_TORCH to pick another version, BENCH_VENV another venv.
# The last line printed is a JSON object: {"seconds": s, "peak_rss_mb": m, "output_mb": o, "vs_streaming": r, ...}.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

VENV=${BENCH_VENV:-.venv-bench}
TORCH=${BENCH_TORCH:-2.13.0}

if [[ ! -x "$VENV/bin/python" ]]; then
    echo "bench_assign: creating $VENV" >&2
    python3 -m venv "$VENV"
fi

pip_quiet() {
    # pip may warn that a configured --find-links "Location ... is ignored"; that is harmless.
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "$@" 2>&1 \
        | { grep -v "Location .* is ignored" || true; } >&2
    return "${PIPESTATUS[0]}"
}

# Skip the installs when the venv already holds everything (a re-run starts at once).
if ! "$VENV/bin/python" - "$TORCH" <<'PY' 2>/dev/null; then
import importlib.metadata as md
import sys

assert md.version("torch").split("+")[0] == sys.argv[1]
md.version("mosaicml-streaming")
import shardfeed  # noqa: F401  (an editable install of this checkout)
PY
    echo "bench_assign: installing torch==$TORCH, then -e .[bench] into $VENV" >&2
    pip_quiet "torch==$TORCH"
    # torch named again so the resolver keeps this CPU build instead of upgrading it.
    pip_quiet "torch==$TORCH" -e '.[bench]'
fi

exec "$VENV/bin/python" scripts/bench_assign.py "$@"
