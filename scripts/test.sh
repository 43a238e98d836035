#!/usr/bin/env bash
# Lint and test: bash scripts/test.sh [--full] [pytest args...]
#
#   --full   also run the long loops (sets SHARDFEED_FULL=1; not passed to pytest)
#
# Uses .venv (created if missing) with the [dev], [beam], [dask], [video] and [plot] extras installed. Sets SHARDFEED_CORPORA to
# ../shared/corpora when that folder exists and the variable is not already set, and stops when
# neither gives a corpus directory (SHARDFEED_NO_CORPORA=1 runs without the real-corpus tests).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

VENV=.venv
PYTEST_ARGS=()
for arg in "$@"; do
    if [[ "$arg" == "--full" ]]; then
        export SHARDFEED_FULL=1
    else
        PYTEST_ARGS+=("$arg")
    fi
done

if [[ ! -x "$VENV/bin/python" ]]; then
    echo "test.sh: creating $VENV"
    python3 -m venv "$VENV"
fi
# Reinstall only when pyproject.toml changed since the last install (the install is editable, so
# code changes need none). setuptools>=69 and wheel let tests/test_packaging.py build the wheel
# without build isolation. pip may warn that a configured index or --find-links "Location ... is
# ignored"; that is harmless.
STAMP="$VENV/.shardfeed-dev-install"
WANT="$(cat pyproject.toml scripts/test.sh | sha256sum | cut -d' ' -f1)"
if [[ "$(cat "$STAMP" 2>/dev/null || true)" != "$WANT" ]]; then
    echo "test.sh: installing -e '.[dev,beam,dask,video,plot]' into $VENV"
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
        -e '.[dev,beam,dask,video,plot]' 'setuptools>=69' wheel 2>&1 \
        | { grep -v "Location .* is ignored" || true; } >&2
    echo "$WANT" >"$STAMP"
fi

if [[ -z "${SHARDFEED_CORPORA:-}" && -d ../shared/corpora ]]; then
    SHARDFEED_CORPORA="$(cd ../shared/corpora && pwd)"
    export SHARDFEED_CORPORA
fi
# The tests on real corpora skip without them; here that would pass a run that tested less, so
# their absence stops the run unless asked for (SHARDFEED_NO_CORPORA=1, e.g. a checkout alone).
if [[ ! -d "${SHARDFEED_CORPORA:-/nonexistent}" && "${SHARDFEED_NO_CORPORA:-}" != "1" ]]; then
    echo "test.sh: no corpus directory (SHARDFEED_CORPORA='${SHARDFEED_CORPORA:-}', and no ../shared/corpora" \
        "to default to); set SHARDFEED_NO_CORPORA=1 to run without the tests on real corpora" >&2
    exit 2
fi

export PATH="$PWD/$VENV/bin:$PATH"
echo "test.sh: ruff check"
ruff check .
echo "test.sh: ruff format --check"
ruff format --check .
echo "test.sh: pytest ${PYTEST_ARGS[*]:-}"
python -m pytest ${PYTEST_ARGS[@]+"${PYTEST_ARGS[@]}"}

# After the main suite passes: the real lerobot library loads our output and the PyTorch adapter
# splits epochs across DataLoader workers (their own venv, with torch); then the tf.data adapter
# (its own venv: TensorFlow 2.16 needs numpy < 2). Before them, the core alone on the newest
# pyarrow, numpy and Pillow its ranges allow. SHARDFEED_SKIP_INTEROP=1 skips all three for quick
# local runs; CI always runs them.
if [[ "${SHARDFEED_SKIP_INTEROP:-}" == "1" ]]; then
    echo "test.sh: SHARDFEED_SKIP_INTEROP=1: skipping scripts/test_lerobot_interop.sh, scripts/test_tf_interop.sh and scripts/test_core_latest.sh"
else
    echo "test.sh: the core on the newest pyarrow, numpy and Pillow, without Beam (scripts/test_core_latest.sh)"
    bash scripts/test_core_latest.sh
    echo "test.sh: lerobot and torch interop (scripts/test_lerobot_interop.sh)"
    bash scripts/test_lerobot_interop.sh
    echo "test.sh: tf.data interop (scripts/test_tf_interop.sh)"
    bash scripts/test_tf_interop.sh
fi
