#!/usr/bin/env bash
# One run of the app on Flower's Deployment Engine over loopback: TLS, SuperNode authentication, N SuperNodes,
# `flwr run`, status check, everything stopped afterwards. All options: scripts/deploy_local.sh --help
# e.g. scripts/deploy_local.sh --supernodes 2 --data-paths ",/data/mine.jsonl" --run-config conf/fedit.toml
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
[ -x "$PY" ] || PY=python3
exec "$PY" -m fedprune_cli.deploy "$@"
