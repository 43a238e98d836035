# Sourced by benchmarks that need only the core install: use .venv when it exists (scripts/test.sh
# creates it), else create it with `pip install -e .`. BENCH_VENV picks another venv; the caller
# sets CORE_CHECK to a Python import that proves the install is there. Sets VENV.

VENV=${BENCH_VENV:-.venv}

if [[ ! -x "$VENV/bin/python" ]]; then
    echo "bench: creating $VENV" >&2
    python3 -m venv "$VENV"
fi
if ! "$VENV/bin/python" -c "$CORE_CHECK" 2>/dev/null; then
    echo "bench: installing -e . into $VENV" >&2
    # pip may warn that a configured --find-links "Location ... is ignored"; that is harmless.
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -e . 2>&1 \
        | { grep -v "Location .* is ignored" || true; } >&2
fi
