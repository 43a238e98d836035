#!/usr/bin/env bash
# Fuzz the parsers of untrusted input longer than CI does:
#   bash scripts/fuzz.sh [--examples N] [pytest args...]
#
#   --examples N   Hypothesis examples per fuzz test (default 2000; CI runs 40, the default of
#                  SHARDFEED_FUZZ_EXAMPLES in tests/adversarial/test_fuzz_parsers.py)
#
# Runs tests/adversarial/test_fuzz_parsers.py with .venv (created if missing; the [dev] extra is
# installed if pytest or hypothesis is absent, as scripts/test.sh would). Other pytest arguments
# pass through, e.g. `-k tfrecord` or `-x`. Failing examples are kept in Hypothesis' database
# (.hypothesis/), so a re-run replays them first.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

VENV=.venv
EXAMPLES=2000
PYTEST_ARGS=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        --examples)
            [[ $# -ge 2 ]] || { echo "fuzz.sh: --examples needs a number" >&2; exit 2; }
            EXAMPLES="$2"
            shift 2
            ;;
        --examples=*)
            EXAMPLES="${1#--examples=}"
            shift
            ;;
        *)
            PYTEST_ARGS+=("$1")
            shift
            ;;
    esac
done
if ! [[ "$EXAMPLES" =~ ^[1-9][0-9]*$ ]]; then
    echo "fuzz.sh: --examples must be a positive integer, got '$EXAMPLES'" >&2
    exit 2
fi

if [[ ! -x "$VENV/bin/python" ]]; then
    echo "fuzz.sh: creating $VENV"
    python3 -m venv "$VENV"
fi
if ! "$VENV/bin/python" -c "import shardfeed, hypothesis, pytest" 2>/dev/null; then
    echo "fuzz.sh: installing -e '.[dev]' into $VENV"
    # pip may warn that a configured --find-links "Location ... is ignored"; that is harmless.
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -e '.[dev]' 2>&1 \
        | { grep -v "Location .* is ignored" || true; } >&2
fi

export SHARDFEED_FUZZ_EXAMPLES="$EXAMPLES"
echo "fuzz.sh: $EXAMPLES examples per fuzz test"
start=$SECONDS
status=0
"$VENV/bin/python" -m pytest -q -p no:cacheprovider --durations=0 \
    tests/adversarial/test_fuzz_parsers.py ${PYTEST_ARGS[@]+"${PYTEST_ARGS[@]}"} || status=$?
echo "fuzz.sh: finished in $((SECONDS - start)) s with exit status $status"
exit "$status"
