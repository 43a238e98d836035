#!/usr/bin/env bash
# Quickstart: set up a venv, build a small sample dataset, verify it and show what it holds.
#
#   bash scripts/quickstart.sh        # from anywhere; works in the repo root
#
# Leaves the dataset in out/quickstart (replaced on every run).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

VENV=.venv
OUT=out/quickstart

if [[ ! -x "$VENV/bin/python" ]]; then
    echo "quickstart: creating $VENV"
    python3 -m venv "$VENV"
fi
# Core install only: the reader, inspect and verify need no Beam.
# pip may warn that a configured --find-links "Location ... is ignored"; that is harmless.
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -e . 2>&1 \
    | { grep -v "Location .* is ignored" || true; } >&2

# Until the Beam convert pipeline (`shardfeed convert`) exists, the quickstart builds the dataset
# through the Python API (write_dataset) from the in-memory sample made by make_sample_corpus.py.
echo "quickstart: writing a sample robot dataset to $OUT"
"$VENV/bin/python" - "$OUT" <<'PY'
import sys

sys.path.insert(0, "scripts")
from make_sample_corpus import ROBOT_FPS, ROBOT_TYPE, make_robot_samples

import shardfeed

out = sys.argv[1]
features, data, tasks = make_robot_samples(seed=0)
manifest = shardfeed.write_dataset(
    out,
    features,
    data,
    tasks=tasks,
    fps=ROBOT_FPS,
    robot_type=ROBOT_TYPE,
    target_shard_size="48KB",  # tiny on purpose, so the sample splits into several shards
    source="scripts/quickstart.sh",
    overwrite=True,
)
print(f"wrote {manifest.num_samples} samples in {len(manifest.shards)} shards")
PY

echo "quickstart: shardfeed verify $OUT"
"$VENV/bin/shardfeed" verify "$OUT"
echo
"$VENV/bin/shardfeed" inspect "$OUT"
