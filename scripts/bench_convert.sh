#!/usr/bin/env bash
# Conversion benchmark, one command: shardfeed convert vs WebDataset ShardWriter, MDSWriter and cp -r.
#
#   bash scripts/bench_convert.sh --quick     # ~3,000 files / ~60 MB, a few minutes at most
#   bash scripts/bench_convert.sh             # full size: >= 20,000 files, >= 500 MB
#   bash scripts/bench_convert.sh --help      # every option of scripts/bench_convert.py
#
# Creates .venv-bench (git-ignored) when missing and installs shardfeed[beam,bench] into it. torch is
# installed first at an exact version so that pip takes the CPU wheel this machine has on disk instead
# of a multi-GB CUDA build (mosaicml-streaming needs torch); the [bench] extra keeps torch<2.14 for the
# same reason. Set BENCH_TORCH to pick another version.
# The last line printed is a JSON object: {"vs_best_peer": x, "vs_copy": y, "samples_per_s": z, ...}.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

VENV=${BENCH_VENV:-.venv-bench}
TORCH=${BENCH_TORCH:-2.13.0}

if [[ ! -x "$VENV/bin/python" ]]; then
    echo "bench_convert: creating $VENV" >&2
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
for name in ("apache-beam", "webdataset", "mosaicml-streaming", "shardfeed"):
    md.version(name)
import shardfeed  # noqa: F401  (an editable install of this checkout)
PY
    echo "bench_convert: installing torch==$TORCH, then -e .[beam,bench] into $VENV" >&2
    pip_quiet "torch==$TORCH"
    # torch is named again so the resolver keeps it (and picks a torchvision built for it) instead of
    # upgrading to a newer, CUDA-sized torch.
    pip_quiet "torch==$TORCH" -e '.[beam,bench]'
fi

exec "$VENV/bin/python" scripts/bench_convert.py "$@"
