#!/usr/bin/env bash
# Interop test: the tf.data adapter (shardfeed/tf.py) on TensorFlow and tensorflow-io.
#
#   bash scripts/test_tf_interop.sh [pytest args...]
#
# Runs tests/interop/tf_adapter.py in its own virtual environment, .venv-tf (git-ignored; set
# TF_VENV to use another): the [tf] extra pins tensorflow-cpu 2.16 and tensorflow-io 0.37.1, which
# need numpy < 2 and pyarrow < 18, so it cannot share .venv (numpy 2) or .venv-lerobot. shardfeed's
# core then runs on numpy 1.26 and pyarrow 17 there. scripts/test.sh calls this after the lerobot
# interop step (SHARDFEED_SKIP_INTEROP=1 skips both). The first run installs for about a minute;
# a stamp file skips the install until this script or pyproject.toml changes.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

VENV=${TF_VENV:-.venv-tf}

if [[ ! -x "$VENV/bin/python" ]]; then
    echo "test_tf_interop: creating $VENV"
    python3 -m venv "$VENV"
fi

STAMP="$VENV/.shardfeed-tf-install"
WANT="$(cat pyproject.toml scripts/test_tf_interop.sh | sha256sum | cut -d' ' -f1)"
if [[ "$(cat "$STAMP" 2>/dev/null || true)" != "$WANT" ]]; then
    echo "test_tf_interop: installing -e '.[tf]' and pytest into $VENV"
    # A configured --find-links "Location ... is ignored" warning is harmless noise.
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -e '.[tf]' 'pytest>=8' 2>&1 \
        | { grep -v "Location .* is ignored" || true; } >&2
    echo "$WANT" >"$STAMP"
fi

# TensorFlow's C++ start-up chatter (oneDNN notes, CPU feature hints) off; errors still show.
export TF_CPP_MIN_LOG_LEVEL=2

echo "test_tf_interop: pytest tests/interop/tf_adapter.py tests/interop/tfrecord_read.py $*"
# --confcutdir keeps tests/conftest.py (the main suite's fixtures) out of this venv
"$VENV/bin/python" -m pytest tests/interop/tf_adapter.py tests/interop/tfrecord_read.py \
    --confcutdir=tests/interop "$@"
