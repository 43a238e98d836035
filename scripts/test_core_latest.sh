#!/usr/bin/env bash
# The core install on the newest pyarrow, numpy and Pillow it allows, without Beam.
#
#   bash scripts/test_core_latest.sh [pytest args...]
#
# A training container installs only the core (reader, loader, inspect, verify, planners), so the
# core's dependency ranges are not held back by Beam's caps, which live in the [beam] extra. This
# runs the core's own tests in .venv-latest (git-ignored; set LATEST_VENV to use another) with
# `pip install --upgrade -e '.[plot]'`, so each run takes the newest releases the ranges allow,
# and checks that Beam is absent. scripts/test.sh calls it after the main suite
# (SHARDFEED_SKIP_INTEROP=1 skips it with the interop steps).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

VENV=${LATEST_VENV:-.venv-latest}
if [[ ! -x "$VENV/bin/python" ]]; then
    echo "test_core_latest: creating $VENV"
    python3 -m venv "$VENV"
fi
echo "test_core_latest: pip install --upgrade -e '.[plot]' and the test tools into $VENV"
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade \
    -e '.[plot]' 'pytest>=8' 'hypothesis>=6.100' 'jsonschema>=4.18' 2>&1 \
    | { grep -v "Location .* is ignored" || true; } >&2
"$VENV/bin/python" - <<'PY'
import importlib.util, sys
import numpy, PIL, pyarrow
if importlib.util.find_spec("apache_beam") is not None:
    sys.exit("test_core_latest: apache_beam is installed; the core install must not need it")
print(f"test_core_latest: pyarrow {pyarrow.__version__}, numpy {numpy.__version__}, Pillow {PIL.__version__}")
PY

# the tests of the core's own parts: none of them needs Beam, S3, torch or TensorFlow
TESTS=(
    tests/test_assign_properties.py tests/test_assignment_api.py tests/test_batching.py
    tests/test_group_checksums.py tests/test_hot.py tests/test_image_header.py
    tests/test_jsonl_blocks.py tests/test_jsonschema.py tests/test_loader.py
    tests/test_loader_columns.py tests/test_loader_plan.py tests/test_loader_schedule.py
    tests/test_manifest_load.py tests/test_path_template.py tests/test_roundtrip.py
    tests/test_schemas.py tests/test_shard_plan.py tests/test_spans.py
    tests/test_stats_and_payload.py tests/test_storage.py tests/test_episode_summaries.py
    tests/test_tier_copy.py tests/test_tiers.py tests/test_transforms_images.py tests/test_units.py
    tests/test_whole_pieces.py tests/test_writer_lease.py
)
if [[ -z "${SHARDFEED_CORPORA:-}" && -d ../shared/corpora ]]; then
    SHARDFEED_CORPORA="$(cd ../shared/corpora && pwd)"
    export SHARDFEED_CORPORA
fi
# -k: the cases that need moto (S3) or Beam (a conversion first) run in the main suite
ELSEWHERE="not s3 and not commit_whose_answer and not real_lerobot_dataset_assignment"
echo "test_core_latest: pytest (${#TESTS[@]} files, but: $ELSEWHERE) $*"
"$VENV/bin/python" -m pytest -p no:cacheprovider "${TESTS[@]}" -k "$ELSEWHERE" "$@"
