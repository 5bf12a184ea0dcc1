"""What the FedSpaLLM grid reads from its runs' files: the perplexities of summary.json and the zeros per matrix of
sparsity.json."""

from __future__ import annotations

import json
from pathlib import Path

from fedprune_app.methods.fedspallm.masks import target_count
from tools.grids import read_summary


def model_rows(run_dir: Path) -> tuple[list[str], dict[str, dict[str, float]]]:
    """(eval sources, {row: {source: ppl}}) of one run: dense = the server's round-0 score."""
    summary = read_summary(run_dir)
    server = summary["server"]
    last = max(server, key=int)
    sources = [k[len("ppl `"):-1] for k in server["0"]]
    rows = {"dense": {s: server["0"][f"ppl `{s}`"] for s in sources},
            "fedspallm": {s: server[last][f"ppl `{s}`"] for s in sources}}
    for name, vals in summary.get("references", {}).items():
        rows[name] = {k: v for k, v in vals.items() if k in sources or k == "clients"}
    return sources, rows


def exact_sparsity(run_dir: Path, sparsity: float) -> tuple[int, int]:
    """(matrices with exactly ⌈s·d⌉ zeros, matrices) in the saved global model (sparsity.json)."""
    report = json.loads((run_dir / "sparsity.json").read_text())["matrices"]
    exact = sum(m["zeros"] == target_count(sparsity, m["size"]) for m in report.values())
    return exact, len(report)
