#!/usr/bin/env bash
# The smoke preset with every method swapped in, one after another (`make smoke-all`): each run's wall time,
# exit status, run directory and how many models its results.md flags as broken, as a Markdown table on stdout.
#   scripts/smoke_all.sh [method ...]        default: every method; runs go to outputs/smoke/
set -uo pipefail
cd "$(dirname "$0")/.."
FEDPRUNE=${FEDPRUNE:-.venv/bin/fedprune}
METHODS=("$@")
[ ${#METHODS[@]} -gt 0 ] || METHODS=(fedit flexlora fedtpa fedspallm sftp fedflap llmpruner slicegpt)
LOGS=$(mktemp -d)
echo "| method | command | wall time | exit | broken models flagged | run |"
echo "|---|---|---|---|---|---|"
for m in "${METHODS[@]}"; do
    start=$(date +%s)
    "$FEDPRUNE" run --run-config conf/smoke.toml --run-config "method='$m' output-dir='outputs/smoke'" \
        > "$LOGS/$m.log" 2>&1
    rc=$?
    seconds=$(( $(date +%s) - start ))
    dir=$(grep -o "run directory: [^ ]*" "$LOGS/$m.log" | tail -1 | cut -d' ' -f3)
    flagged=$(python3 -c "import json,sys; print(len(json.load(open(sys.argv[1])).get('warnings', [])))" \
        "$dir/summary.json" 2>/dev/null || echo "?")
    echo "| $m | \`make smoke ARGS=\"method='$m'\"\` | $seconds s | $rc | $flagged | \`$dir\` |"
done
echo
echo "logs: $LOGS"
