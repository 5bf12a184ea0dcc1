"""What the FedSpaLLM grid reads from its runs' files: the perplexities of summary.json, the
per-window scores of metrics.jsonl and the zeros per matrix of sparsity.json."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

from experiments.grids import read_metrics, read_summary
from fedprune_app.llm.evaluation import window_scores_of
from fedprune_app.llm.intervals import TokenScores
from fedprune_app.methods.fedspallm.masks import target_count


def model_rows(run_dir: Path) -> tuple[list[str], dict[str, dict[str, float]]]:
    """(eval sources, {row: {source: ppl}}) of one run: dense = the server's round-0 score."""
    summary = read_summary(run_dir)
    server = summary["server"]
    last = max(server, key=int)
    sources = [k[len("ppl `") : -1] for k in server["0"]]
    rows = {
        "dense": {s: server["0"][f"ppl `{s}`"] for s in sources},
        "fedspallm": {s: server[last][f"ppl `{s}`"] for s in sources},
    }
    for name, vals in summary.get("references", {}).items():
        rows[name] = {k: v for k, v in vals.items() if k in sources or k == "clients"}
    return sources, rows


def exact_sparsity(run_dir: Path, sparsity: float) -> tuple[int, int]:
    """(matrices with exactly ⌈s·d⌉ zeros, matrices) in the saved global model (sparsity.json)."""
    report = json.loads((run_dir / "sparsity.json").read_text())["matrices"]
    exact = sum(m["zeros"] == target_count(sparsity, m["size"]) for m in report.values())
    return exact, len(report)


def window_scores(run_dir: Path) -> dict[str, dict[str, list[TokenScores]]]:
    """{row: {source: [per-window scores, one per model]}} of one run: dense = the server's round 0,
    fedspallm = its last round, random / centralized = the server's references, standalone = one per
    client (in client order). Empty for a run recorded before rows carried their windows (then only
    point estimates exist)."""
    rows = read_metrics(run_dir)
    server = [r for r in rows if r.get("phase") == "server-evaluate"]
    if not server or any(window_scores_of(r) is None for r in server):
        return {}
    last = max(int(r["round"]) for r in server)
    out: dict[str, dict[str, list[TokenScores]]] = defaultdict(lambda: defaultdict(list))
    for r in server:
        if int(r["round"]) in (0, last):
            out["dense" if int(r["round"]) == 0 else "fedspallm"][str(r["data"])].append(
                window_scores_of(r)
            )
    refs = [r for r in rows if r.get("phase") == "reference" and r.get("status") != "failed"]
    for r in sorted(refs, key=lambda r: (str(r["model"]), int(r.get("client") or 0))):
        if (scores := window_scores_of(r)) is not None:
            out[str(r["model"])][str(r["data"])].append(scores)
    return {name: dict(per) for name, per in out.items()}
