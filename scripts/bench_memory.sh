#!/usr/bin/env bash
# Bounded-resources benchmark, one command: shardfeed convert of one generated corpus (an image
# folder of JPEGs, and JSONL text) at 1x and 4x its size, and 1M against 10M tiny JSONL records;
# peak RSS and wall time per size.
#
#   bash scripts/bench_memory.sh --quick     # 1x ~260 MB per kind (4x ~1 GB), under 5 minutes
#   bash scripts/bench_memory.sh             # full size: 1x ~620 MB per kind, 2 runs per size
#   bash scripts/bench_memory.sh --kinds tiny --repeat 1   # the 10M-record driver case, ~1 minute
#   bash scripts/bench_memory.sh --help      # every option of scripts/bench_memory.py
#
# Uses .venv when it exists (scripts/test.sh creates it); otherwise creates it and installs
# shardfeed[beam] (convert needs Apache Beam). Set BENCH_VENV to use another venv.
# The last line printed is a JSON object: {"rss_growth": r, "time_growth": t, ...}.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

CORE_CHECK="import numpy, PIL, shardfeed"
# shellcheck source=scripts/core_venv.sh
source scripts/core_venv.sh
if ! "$VENV/bin/python" -c "import apache_beam, shardfeed.pipelines.driver" 2>/dev/null; then
    echo "bench: installing -e .[beam] into $VENV" >&2
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -e ".[beam]" 2>&1 \
        | { grep -v "Location .* is ignored" || true; } >&2
fi

exec "$VENV/bin/python" scripts/bench_memory.py "$@"
