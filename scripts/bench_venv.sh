# Sourced by the bench_*.sh scripts: create or reuse .venv-bench (git-ignored) with shardfeed's
# [beam,bench] extras. torch is installed first at an exact version so that pip takes the CPU wheel
# this machine has on disk instead of a multi-GB CUDA build (mosaicml-streaming needs torch); the
# [bench] extra keeps torch<2.14 for the same reason. BENCH_VENV picks another venv, BENCH_TORCH
# another torch. Sets VENV; expects the caller to have cd'ed to the repo root.

VENV=${BENCH_VENV:-.venv-bench}
TORCH=${BENCH_TORCH:-2.13.0}

if [[ ! -x "$VENV/bin/python" ]]; then
    echo "bench: creating $VENV" >&2
    python3 -m venv "$VENV"
fi

bench_pip_quiet() {
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
for name in ("apache-beam", "webdataset", "mosaicml-streaming", "datasets", "tfrecord", "shardfeed"):
    md.version(name)
import shardfeed  # noqa: F401  (an editable install of this checkout)
PY
    echo "bench: installing torch==$TORCH, then -e .[beam,bench] into $VENV" >&2
    bench_pip_quiet "torch==$TORCH"
    # torch is named again so the resolver keeps it (and picks a torchvision built for it) instead of
    # upgrading to a newer, CUDA-sized torch.
    bench_pip_quiet "torch==$TORCH" -e '.[beam,bench]'
fi

# Byte-compile this checkout's modules, as pip does for every installed wheel (the peers'). An
# editable install otherwise compiles them again in every process when bytecode is not written
# (PYTHONDONTWRITEBYTECODE=1, a read-only checkout): about 0.15 s of each shardfeed process and of
# each of its workers. Unchanged modules are skipped; __pycache__/ is git-ignored.
"$VENV/bin/python" -m compileall -q formats pipelines schemas shardfeed transforms >/dev/null
