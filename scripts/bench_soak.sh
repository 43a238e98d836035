#!/usr/bin/env bash
# Object-store soak, one command: read one dataset from a moto S3 server on loopback through the
# project's fault-injecting proxy (tests/s3_proxy.py), fault-free and then with a share of
# requests failed (503 SlowDown, 500, 429, dropped connections before and after the store, bodies
# cut off midway, answers slower than the client's timeout): verify, then the loader, epochs in
# turn. Prints requests, faults injected by kind, retries and the time they added; under a minute.
#
#   bash scripts/bench_soak.sh                  # one fault in ten requests, 3 epochs
#   bash scripts/bench_soak.sh --period 5       # one in five
#   bash scripts/bench_soak.sh --help
#
# Uses .venv (scripts/test.sh creates it; it has moto and boto3), else creates it with the [dev]
# extra. The last line printed is a JSON object: {"ok": true, "requests": n, "faults": {...}, ...}.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

CORE_CHECK="import moto.server, boto3, shardfeed"
# shellcheck source=scripts/core_venv.sh
source scripts/core_venv.sh
if ! "$VENV/bin/python" -c "$CORE_CHECK" 2>/dev/null; then
    echo "bench: installing -e .[dev] into $VENV" >&2
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -e ".[dev]" 2>&1 \
        | { grep -v "Location .* is ignored" || true; } >&2
fi

exec "$VENV/bin/python" scripts/bench_soak.py "$@"
