"""FedSpaLLM's Tables 1–3, the claims and the communication table, from the records."""

from __future__ import annotations

import json
from pathlib import Path

from tools.grids import UNRESOLVED, Cell, fmt_ppl, mark, model_parameters, read_config, read_metrics, runs_section
from tools.grids.fedspallm.cells import TABLES
from tools.grids.fedspallm.records import exact_sparsity, model_rows

ROWS = ("dense", "random", "standalone", "fedspallm", "centralized")


def render(grid_cells: list[Cell], runs: dict[str, Path]) -> str:
    lines = ["# FedSpaLLM on this app: the paper's Tables 1–3 and communication", "",
             "Perplexity of held-out text per domain (lower is better). Rows: the dense model, a random mask, the "
             "mean of the client models each pruned with only its own data (standalone), the FedSpaLLM global "
             "model, and SparseGPT on all clients' calibration data pooled (centralized; the reference a "
             "federation cannot run). Every number is read from the runs' summary.json; run directories below.", ""]
    claims: dict[str, list[bool]] = {"le": [], "random": [], "exact": []}
    gaps: dict[str, dict[float, float]] = {}
    details: list[str] = []
    exact_counts = [0, 0]
    for group, n in TABLES.items():
        group_cells = [c for c in grid_cells if c.group == group]
        if not group_cells:
            continue
        lines += [f"## {group.replace('table', 'Table ')}: {n} clients", ""]
        present = [c for c in group_cells if c.tag in runs]
        if present:  # the header from the first finished cell, so a missing cell's row sits inside the table
            sources = model_rows(runs[present[0].tag])[0]
            lines += ["| sparsity | model | " + " | ".join(f"`{x}`" for x in sources) + " |",
                      "|---|---|" + "---|" * len(sources)]
        else:
            lines += ["| sparsity | model |", "|---|---|"]
        for cell in group_cells:
            s = cell.settings["sparsity"]
            if cell.tag not in runs:
                lines.append(f"| {round(s * 100)}% | *not run* |")
                continue
            sources, rows = model_rows(runs[cell.tag])
            for name in ROWS:
                if name in rows:
                    label = f"{name} (mean of {int(rows[name]['clients'])})" if "clients" in rows[name] else name
                    lines.append(f"| {round(s * 100)}% | {label} | "
                                 + " | ".join(fmt_ppl(rows[name].get(x)) for x in sources) + " |")
            fed, std, rnd = rows["fedspallm"], rows.get("standalone"), rows.get("random")
            if std:
                ok = [fed[x] <= std[x] for x in sources]
                claims["le"] += ok
                if not all(ok):
                    details.append(f"{group} {round(s * 100)}%: FedSpaLLM above standalone on "
                                   + ", ".join(x for x, good in zip(sources, ok, strict=True) if not good))
                gaps.setdefault(group, {})[s] = sum((std[x] - fed[x]) / std[x] for x in sources) / len(sources)
            if rnd:
                claims["random"] += [rnd[x] >= 100 * fed[x] for x in sources]
            exact, total = exact_sparsity(runs[cell.tag], s)
            exact_counts[0] += exact
            exact_counts[1] += total
            claims["exact"].append(exact == total)
        lines.append("")
    tokens = sorted({int(t) for c in grid_cells if c.tag in runs
                     if (t := read_config(runs[c.tag]).get("eval-ppl-tokens")) is not None})
    counted = f"{' / '.join(f'{t:,}' for t in tokens)} tokens per domain" if tokens else "an unrecorded token count"
    basis = f"point estimates on {counted}, no interval: unresolved until the perplexities carry bootstrap intervals"
    lines += ["## Claims", "",
              "A claim between two perplexities is decided only by an interval; these records hold point "
              "estimates, so those claims read unresolved with their point comparison beside them.", ""]
    le = claims["le"]
    lines.append(f"- The global model's perplexity is at or below the standalone mean at every sparsity: "
                 f"{mark(UNRESOLVED if le else None)} ({sum(le)}/{len(le)} (setting, domain) pairs at the {basis})"
                 + (f"; exceptions: {'; '.join(details)}" if details else "") + ".")
    grows = [all(b > a for a, b in zip(list(g.values()), list(g.values())[1:], strict=False))
             for g in gaps.values() if len(g) > 1]
    gap_text = "; ".join(f"{group}: " + ", ".join(f"{round(s * 100)}% {100 * v:+.1f}%" for s, v in sorted(g.items()))
                         for group, g in gaps.items())
    lines.append(f"- The gap (standalone − FedSpaLLM, relative, mean over domains) grows with sparsity: "
                 f"{mark(UNRESOLVED if grows else None)} ({gap_text}; grows in {sum(grows)}/{len(grows)} groups at "
                 f"the {basis}).")
    rnd = claims["random"]
    lines.append(f"- Random pruning is orders of magnitude worse (≥ 100× FedSpaLLM's perplexity): "
                 f"{mark(all(rnd) if rnd else None)} ({sum(rnd)}/{len(rnd)}; a margin of 100× no sampling error of "
                 "a perplexity on these token counts approaches).")
    ex = claims["exact"]
    lines.append(f"- Every pruned matrix of the global model has exactly ⌈s·d⌉ zeros: {mark(all(ex) if ex else None)} "
                 f"({exact_counts[0]}/{exact_counts[1]} matrices over {len(ex)} runs; a count, no sampling error).")
    lines += ["", *communication(grid_cells, runs), "", *runs_section(grid_cells, runs)]
    return "\n".join(lines) + "\n"


def communication(grid_cells: list[Cell], runs: dict[str, Path]) -> list[str]:
    """Mean bytes per client and round, with layer sampling (comm cell) and without (Table 1 at 50%)."""
    settings = [("every layer (r_i = 1)", "table1-s50"), ("layer sampling (r_i = 0.5)", "comm-sampled")]
    lines = ["## Communication per client and round", "",
             "| setting | down (MB) | up (MB) | whole model fp32 (MB) | prunable matrices fp32 (MB) |",
             "|---|---|---|---|---|"]
    for label, tag in settings:
        if tag not in runs:
            lines.append(f"| {label} | *not run* | | | |")
            continue
        rows = [r for r in read_metrics(runs[tag]) if r.get("phase") == "train" and r.get("status") == "accepted"]
        down = sum(r["bytes-down"] for r in rows) / len(rows)
        up = sum(r["bytes-up"] for r in rows) / len(rows)
        params = model_parameters(str(read_config(runs[tag]).get("model-name", "embedded")))
        whole = "–" if params is None else f"{4 * params / 1e6:.1f}"  # from the config: no weights archived
        prunable = 4 * json.loads((runs[tag] / "sparsity.json").read_text())["size"]
        lines.append(f"| {label} | {down / 1e6:.1f} | {up / 1e6:.1f} | {whole} | {prunable / 1e6:.1f} |")
    lines += ["", "Down: the sampled layers' global weights (fp32). Up: their pruned weights (fp32, zeros included) "
              "and bool masks. The embeddings and norms never travel."]
    return lines
