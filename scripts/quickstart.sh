#!/usr/bin/env bash
# Quickstart: set up a venv, convert a generated sample corpus into a dataset, verify it, show it.
#
#   bash scripts/quickstart.sh        # from anywhere; works in the repo root
#
# Writes the raw sample corpus to out/quickstart-src and the dataset to out/quickstart (both
# replaced on every run). Runs on Beam's in-process runner, with no network access.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

VENV=.venv
SRC=out/quickstart-src
OUT=out/quickstart

if [[ ! -x "$VENV/bin/python" ]]; then
    echo "quickstart: creating $VENV"
    python3 -m venv "$VENV"
fi
# `shardfeed convert` needs the [beam] extra (the reader, inspect, verify and rejects do not).
# pip may warn that a configured --find-links "Location ... is ignored"; that is harmless.
echo "quickstart: installing -e '.[beam]' into $VENV"
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -e '.[beam]' 2>&1 \
    | { grep -v "Location .* is ignored" || true; } >&2

# A class-per-directory image folder: 240 small JPEG/PNG pictures of four shapes, plus two
# deliberately broken files (a truncated JPEG, a text file named .png) that convert rejects.
echo "quickstart: writing a sample image folder to $SRC"
"$VENV/bin/python" scripts/make_sample_corpus.py --kind imagefolder-corpus --out "$SRC" --bad 2 \
    --overwrite

# A tiny target shard size on purpose, so the 1 MB sample splits into several shards.
echo "quickstart: shardfeed convert $SRC $OUT"
"$VENV/bin/shardfeed" convert "$SRC" "$OUT" --overwrite --target-shard-size 150KB

echo
echo "quickstart: shardfeed verify $OUT"
"$VENV/bin/shardfeed" verify "$OUT"
echo
echo "quickstart: shardfeed rejects $OUT"
"$VENV/bin/shardfeed" rejects "$OUT"
echo
"$VENV/bin/shardfeed" inspect "$OUT"
