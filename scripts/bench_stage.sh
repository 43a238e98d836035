#!/usr/bin/env bash
# Staging benchmark, one command: shardfeed stage (sha256 while copying, fsync, rename) against
# cp -r and rclone copy --checksum, on a generated dataset of random bytes copied to a local dir.
#
#   bash scripts/bench_stage.sh             # full size: 1 GB in 100 MB shards, 3 runs each
#   bash scripts/bench_stage.sh --quick     # 200 MB in 50 MB shards, well under 3 minutes
#   bash scripts/bench_stage.sh --help      # every option of scripts/bench_stage.py
#
# Uses .venv when it exists (scripts/test.sh creates it); otherwise creates it with the core install
# (pip install -e .), which is all this benchmark needs. Set BENCH_VENV to use another venv.
# Installs Debian's rclone with apt-get when it is missing (--no-install to skip: vs_rclone is null).
# Run as root to drop the page cache before each run (else the output says it was not dropped).
# The last line printed is a JSON object: {"vs_cp": x, "vs_rclone": y, ...}.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

CORE_CHECK="import numpy, shardfeed.staging"
# shellcheck source=scripts/core_venv.sh
source scripts/core_venv.sh

exec "$VENV/bin/python" scripts/bench_stage.py "$@"
