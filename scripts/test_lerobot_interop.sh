#!/usr/bin/env bash
# Interop tests with torch: the real `lerobot` library loads what `shardfeed convert` writes, and
# the PyTorch adapter (shardfeed/torch.py) splits an epoch across DataLoader workers and ranks.
#
#   bash scripts/test_lerobot_interop.sh [pytest args...]
#
# Runs tests/interop/lerobot_load.py, tests/interop/torch_adapter.py and
# tests/interop/torch_s3_faults.py (a DataLoader reading S3 from a moto server through object-store
# faults) in their own virtual environment, .venv-lerobot (git-ignored; set LEROBOT_VENV to use
# another), so torch stays out of
# .venv. scripts/test.sh calls this after the main suite passes (SHARDFEED_SKIP_INTEROP=1 skips it
# there). Sets SHARDFEED_CORPORA to ../shared/corpora when that folder exists and the variable is
# not already set.
#
# What gets installed, and why:
#   - torch==2.13.0, named in the same pip command as everything else: pip then takes the CPU wheel
#     on this machine's disk instead of a multi-GB CUDA build;
#   - torchvision 0.28.0 (torch 2.13's); the test works around its PyPI wheel being CUDA-built;
#   - the packages lerobot's dataset loading path imports (datasets, huggingface-hub, accelerate,
#     av, pandas, packaging), inside lerobot 0.4.4's own version ranges;
#   - shardfeed itself, editable, with [beam] (the test runs `shardfeed convert`), and pytest;
#   - jsonlines, which LeRobot's v2.1 -> v3.0 converter imports (`scripts/bench_convert.sh --kind
#     lerobot` runs it in this venv);
#   - then lerobot==0.4.4 with --no-deps: it pins torch<2.11, which has no wheel here, and pulls
#     robot, policy and logging packages (wandb, rerun-sdk, opencv, gymnasium, ...) that loading a
#     dataset does not use.
# A stamp file skips the installs until this script or pyproject.toml changes.
# Nothing touches the network at test time: the Hugging Face variables below make the hub and
# datasets offline, and the test itself refuses non-loopback connections.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

VENV=${LEROBOT_VENV:-.venv-lerobot}
TORCH=2.13.0
TORCHVISION=0.28.0
LEROBOT=0.4.4

if [[ ! -x "$VENV/bin/python" ]]; then
    echo "test_lerobot_interop: creating $VENV"
    python3 -m venv "$VENV"
fi

pip_quiet() {
    # Harmless noise dropped: a configured --find-links "Location ... is ignored", and, on a
    # reinstall, pip listing lerobot's own pins (torch<2.11, wandb, ...) that --no-deps leaves unmet.
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "$@" 2>&1 \
        | { grep -v -e "Location .* is ignored" -e "^lerobot .* requires " \
            -e "^ERROR: pip's dependency resolver does not currently take into account" || true; } >&2
    return "${PIPESTATUS[0]}"
}

STAMP="$VENV/.shardfeed-interop-install"
WANT="$(cat pyproject.toml scripts/test_lerobot_interop.sh | sha256sum | cut -d' ' -f1)"
if [[ "$(cat "$STAMP" 2>/dev/null || true)" != "$WANT" ]]; then
    echo "test_lerobot_interop: installing torch==$TORCH, lerobot==$LEROBOT (--no-deps) and -e '.[beam]' into $VENV"
    pip_quiet "torch==$TORCH" "torchvision==$TORCHVISION" \
        "datasets>=4.0,<5" "huggingface-hub>=0.34.2,<0.36" "accelerate>=1.10,<2" "av>=15,<16" \
        "pandas>=2.0" "packaging>=24.2,<26" "jsonlines>=4" "pytest>=8" "moto[server]>=5.0" -e '.[beam]'
    pip_quiet --no-deps "lerobot==$LEROBOT"
    echo "$WANT" >"$STAMP"
fi

if [[ -z "${SHARDFEED_CORPORA:-}" && -d ../shared/corpora ]]; then
    SHARDFEED_CORPORA="$(cd ../shared/corpora && pwd)"
    export SHARDFEED_CORPORA
fi

HF_TMP="$(mktemp -d "${TMPDIR:-/tmp}/shardfeed-interop-hf.XXXXXX")"
trap 'rm -rf "$HF_TMP"' EXIT
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1
export HF_HOME="$HF_TMP" HF_LEROBOT_HOME="$HF_TMP/lerobot"

echo "test_lerobot_interop: pytest tests/interop/lerobot_load.py tests/interop/torch_adapter.py tests/interop/torch_s3_faults.py $*"
# --confcutdir keeps tests/conftest.py (the main suite's fixtures) out of this venv
"$VENV/bin/python" -m pytest tests/interop/lerobot_load.py tests/interop/torch_adapter.py \
    tests/interop/torch_s3_faults.py \
    --confcutdir=tests/interop "$@"
