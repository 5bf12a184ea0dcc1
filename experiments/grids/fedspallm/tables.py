"""FedSpaLLM's Tables 1–3, the claims and the communication table, from the records."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from experiments.grids import (
    UNRESOLVED,
    Cell,
    Pair,
    fmt_ppl,
    judge,
    mark,
    model_parameters,
    read_config,
    read_metrics,
    replicate_tags,
    runs_section,
)
from experiments.grids.fedspallm.cells import TABLES
from experiments.grids.fedspallm.paired import gap_growth, global_vs_standalone
from experiments.grids.fedspallm.records import exact_sparsity, model_rows, window_scores

ROWS = ("dense", "random", "standalone", "fedspallm", "centralized")
TITLES = {
    "paper": "## The paper's protocol: 4 clients calibrate on IID shares of one generic corpus "
    "(reddit + amazon_reviews, C4's stand-in), scored zero-shot on corpora none of them "
    "calibrated on"
}


def render(grid_cells: list[Cell], runs: dict[str, Path]) -> str:
    lines = [
        "# FedSpaLLM on this app: the paper's Tables 1–3 and communication",
        "",
        "Perplexity of held-out text per domain (lower is better). Rows: the dense model, a random "
        "mask, the mean of the client models each pruned with only its own data (standalone), the "
        "FedSpaLLM global model, and SparseGPT on all clients' calibration data pooled "
        "(centralized; the reference a federation cannot run). Tables 1–3 follow this app's "
        "protocol (each client calibrates on its own domain; the four domains are scored); the "
        "last table the paper's (conf/fedspallm-paper.toml). Every number is read from the runs' "
        "summary.json; run directories below.",
        "",
    ]
    claims: dict[str, list[bool]] = {"random": [], "exact": []}
    exact_counts = [0, 0]
    evidence = {name: Evidence() for name in PROTOCOLS}
    for group, n in TABLES.items():
        group_cells = [
            c for c in grid_cells if c.group == group and "replicate-of" not in c.settings
        ]
        ev = evidence[protocol_of(group)]
        ev.gap_pairs += gap_pairs(group, group_cells, grid_cells, runs)
        if not group_cells:
            continue
        lines += [TITLES.get(group, f"## {group.replace('table', 'Table ')}: {n} clients"), ""]
        present = [c for c in group_cells if c.tag in runs]
        if (
            present
        ):  # the header from the first finished cell, so a missing cell's row sits inside the table
            sources = model_rows(runs[present[0].tag])[0]
            lines += [
                "| sparsity | model | " + " | ".join(f"`{x}`" for x in sources) + " |",
                "|---|---|" + "---|" * len(sources),
            ]
        else:
            lines += ["| sparsity | model |", "|---|---|"]
        for cell in group_cells:
            s = cell.settings["sparsity"]
            if cell.tag not in runs:
                lines.append(f"| {round(s * 100)}% | *not run* |")
                ev.le_pairs.append(
                    (f"{group} {round(s * 100)}%", None, None, lambda a, b: a <= b)
                )  # not checked
                continue
            sources, rows = model_rows(runs[cell.tag])
            for name in ROWS:
                if name in rows:
                    label = (
                        f"{name} (mean of {int(rows[name]['clients'])})"
                        if "clients" in rows[name]
                        else name
                    )
                    lines.append(
                        f"| {round(s * 100)}% | {label} | "
                        + " | ".join(fmt_ppl(rows[name].get(x)) for x in sources)
                        + " |"
                    )
            fed, std, rnd = rows["fedspallm"], rows.get("standalone"), rows.get("random")
            if std:
                ev.le_pairs += [
                    global_vs_standalone(
                        replicates(cell, grid_cells, runs), x, f"{group} {round(s * 100)}% `{x}`"
                    )
                    for x in sources
                ]
                ok = [fed[x] <= std[x] for x in sources]
                ev.le_points += ok
                if not all(ok):
                    ev.details.append(
                        f"{group} {round(s * 100)}%: FedSpaLLM above standalone on "
                        + ", ".join(x for x, good in zip(sources, ok, strict=True) if not good)
                    )
                ev.gaps.setdefault(group, {})[s] = sum(
                    (std[x] - fed[x]) / std[x] for x in sources
                ) / len(sources)
                ev.tokens |= token_counts(runs[cell.tag])
            if rnd:
                claims["random"] += [rnd[x] >= 100 * fed[x] for x in sources]
            exact, total = exact_sparsity(runs[cell.tag], s)
            exact_counts[0] += exact
            exact_counts[1] += total
            claims["exact"].append(exact == total)
        lines.append("")
    lines += [
        "## Claims",
        "",
        "A claim between two perplexities is decided by a paired 95% interval: every model of a "
        "run is scored on the same windows of each text, the windows are resampled together "
        "(replicate seeds of a cell, where run, are pooled by a two-stage bootstrap), and n counts "
        "the windows behind each comparison. A run recorded without per-window scores has point "
        "estimates only, which decide nothing: a claim that rests on such runs reads unresolved, "
        "unless a run that recorded its windows refutes it. The two protocols are judged apart.",
        "",
    ]
    for name, ev in evidence.items():
        lines += perplexity_claims(PROTOCOLS[name], ev)
    rnd = claims["random"]
    lines.append(
        f"- Random pruning is orders of magnitude worse (≥ 100× FedSpaLLM's perplexity): "
        f"{mark(all(rnd) if rnd else None)} ({sum(rnd)}/{len(rnd)}; a margin of 100× no sampling "
        "error of a perplexity on these token counts approaches)."
    )
    ex = claims["exact"]
    lines.append(
        "- Every pruned matrix of the global model has exactly ⌈s·d⌉ zeros: "
        f"{mark(all(ex) if ex else None)} ({exact_counts[0]}/{exact_counts[1]} matrices over "
        f"{len(ex)} runs; a count, no sampling error)."
    )
    lines += [
        "",
        *seed_replicates(grid_cells, runs),
        *mask_agreement(grid_cells, runs),
        *communication(grid_cells, runs),
        "",
        *runs_section(grid_cells, runs),
    ]
    return "\n".join(lines) + "\n"


PROTOCOLS = {
    "app": "this app's protocol (Tables 1–3: each client calibrates on its own domain)",
    "paper": "the paper's protocol (one generic calibration corpus, zero-shot corpora)",
}


def protocol_of(group: str) -> str:
    return "paper" if group == "paper" else "app"


@dataclass
class Evidence:
    """What one protocol's perplexity claims are decided on: paired comparisons (None where a run
    lacks windows), and the point estimates that stand in for them on older records."""

    le_pairs: list[Pair | None] = field(default_factory=list)
    gap_pairs: list[Pair | None] = field(default_factory=list)
    le_points: list[bool] = field(default_factory=list)
    details: list[str] = field(default_factory=list)
    gaps: dict[str, dict[float, float]] = field(default_factory=dict)
    tokens: set[int] = field(default_factory=set)


def token_counts(run_dir: Path) -> set[int]:
    """Tokens scored per domain: from the recorded windows where the run has them, else the
    configured cap."""
    windows = window_scores(run_dir).get("fedspallm", {})
    if windows:
        return {scores[0].token_count for scores in windows.values()}
    configured = read_config(run_dir).get("eval-ppl-tokens")
    return {int(configured)} if configured is not None else set()


def perplexity_claims(protocol: str, ev: Evidence) -> list[str]:
    """The two perplexity claims of one protocol: by their paired intervals when every run recorded
    its windows; else not held when a pair that carries an interval refutes the claim (one measured
    reversal decides a claim made "at every sparsity", whatever the runs without windows show), and
    unresolved beside the point comparison otherwise; nothing when the protocol has no finished
    cell."""
    if not ev.le_points:
        return []
    counted = f"{' / '.join(f'{t:,}' for t in sorted(ev.tokens))} tokens per domain"
    basis = (
        f"point estimates on {counted}, no interval: unresolved until the perplexities carry "
        "bootstrap intervals"
    )
    lines = []
    if all(p is not None for p in ev.le_pairs):  # every finished run recorded its windows
        held, text = judge([p for p in ev.le_pairs if p is not None])
        lines.append(
            f"- Under {protocol}, the global model's perplexity is at or below the standalone mean "
            f"at every sparsity: {mark(held)} (Δ = ppl global − mean ppl standalone on "
            f"{counted}; {text})."
        )
    else:
        le, refuted = ev.le_points, refutation(ev.le_pairs)
        points = f"{sum(le)}/{len(le)} (setting, domain) pairs at the "
        lines.append(
            f"- Under {protocol}, the global model's perplexity is at or below the standalone mean "
            f"at every sparsity: {mark(False if refuted else UNRESOLVED)} ("
            + (
                f"decided by the runs that recorded their windows: {refuted}; every run: "
                f"{points}point estimates on {counted}"
                if refuted
                else points + basis
            )
            + ")"
            + (f"; exceptions: {'; '.join(ev.details)}" if ev.details else "")
            + "."
        )
    if not ev.gap_pairs:
        lines.append(
            f"- Under {protocol}, the gap (standalone − FedSpaLLM, relative, mean over domains) "
            f"grows with sparsity: {mark(None)} (fewer than two finished sparsities)."
        )
    elif all(p is not None for p in ev.gap_pairs):
        held, text = judge([p for p in ev.gap_pairs if p is not None])
        lines.append(
            f"- Under {protocol}, the gap (standalone − FedSpaLLM, relative, mean over domains) "
            f"grows with sparsity: {mark(held)} (gap in %, higher vs lower sparsity: {text})."
        )
    else:
        grows = [
            all(b > a for a, b in zip(list(g.values()), list(g.values())[1:], strict=False))
            for g in ev.gaps.values()
            if len(g) > 1
        ]
        gap_text = "; ".join(
            f"{group}: "
            + ", ".join(f"{round(s * 100)}% {100 * v:+.1f}%" for s, v in sorted(g.items()))
            for group, g in ev.gaps.items()
        )
        refuted = refutation(ev.gap_pairs)
        lines.append(
            f"- Under {protocol}, the gap (standalone − FedSpaLLM, relative, mean over domains) "
            f"grows with sparsity: {mark(False if refuted else UNRESOLVED if grows else None)} ("
            + (
                "decided by the runs that recorded their windows, gap in %, higher vs lower "
                f"sparsity: {refuted}; every run at the point estimates on {counted}: {gap_text})"
                if refuted
                else f"{gap_text}; grows in {sum(grows)}/{len(grows)} groups at the {basis})"
            )
            + "."
        )
    return lines


def refutation(pairs: list[Pair | None]) -> str:
    """The evidence of the pairs that carry an interval (`judge`) when one of them refutes the
    claim, else "": a pair is None where a run lacks windows, and those decide nothing either
    way."""
    measured = [p for p in pairs if p is not None and p[1] is not None and p[2] is not None]
    held, text = judge(measured) if measured else (None, "")
    return text if held is False else ""


def replicates(cell: Cell, grid_cells: list[Cell], runs: dict[str, Path]) -> list[Path]:
    """A table cell's run, then its finished seed replicates (cells whose `replicate-of` is its
    tag), by seed."""
    return [
        runs[t]
        for t in replicate_tags((c.tag for c in grid_cells if c.tag in runs), cell.tag).values()
    ]


def gap_pairs(
    group: str, group_cells: list[Cell], grid_cells: list[Cell], runs: dict[str, Path]
) -> list[Pair | None]:
    """The paired gap comparison of each two consecutive finished sparsities of a group
    (`paired.gap_growth`), and a not-checked entry for each of its sparsities not run yet: the claim
    spans every sparsity of the group, so it is not decided on the finished ones alone."""
    done = sorted((c for c in group_cells if c.tag in runs), key=lambda c: c.settings["sparsity"])
    out: list[Pair | None] = []
    for lo, hi in zip(done, done[1:], strict=False):
        sources = model_rows(runs[lo.tag])[0]
        label = (
            f"{group} {round(hi.settings['sparsity'] * 100)}% vs "
            f"{round(lo.settings['sparsity'] * 100)}%"
        )
        out.append(
            gap_growth(
                replicates(lo, grid_cells, runs), replicates(hi, grid_cells, runs), sources, label
            )
        )
    if out:
        out += [
            (f"{group} {round(c.settings['sparsity'] * 100)}%", None, None, lambda a, b: a > b)
            for c in group_cells
            if c.tag not in runs and "replicate-of" not in c.settings
        ]
    return out


def seed_replicates(grid_cells: list[Cell], runs: dict[str, Path]) -> list[str]:
    """Per table cell with finished seed replicates and per text: each seed's dense, global,
    standalone-mean and centralized perplexity ('–' where a run lacks that model), and
    global − standalone in % of the standalone mean: the run-to-run variation that the pooled
    intervals of the claims hold. Nothing while no cell has a finished replicate."""
    rows = []
    for cell in grid_cells:
        if "replicate-of" in cell.settings:
            continue
        tags = replicate_tags((c.tag for c in grid_cells if c.tag in runs), cell.tag)
        if len(tags) < 2:
            continue
        read = [model_rows(runs[tag]) for tag in tags.values()]  # seed 0 (the cell itself) first
        seeds = [models for _, models in read]
        for x in read[0][0]:

            def per_seed(name: str, x: str = x, seeds: list[dict] = seeds) -> str:
                return " / ".join(fmt_ppl(models.get(name, {}).get(x)) for models in seeds)

            gaps = [
                f"{100 * (m['fedspallm'][x] - m['standalone'][x]) / m['standalone'][x]:+.1f}"
                if x in m.get("standalone", {})
                else "–"
                for m in seeds
            ]
            rows.append(
                f"| `{cell.tag}` | `{x}` | {' / '.join(map(str, tags))} | {per_seed('dense')} | "
                f"{per_seed('fedspallm')} | {per_seed('standalone')} | {per_seed('centralized')} | "
                f"{' / '.join(gaps)} |"
            )
    if not rows:
        return []
    return [
        "## Seed replicates",
        "",
        "The cells run with several seeds (`--seeds`): the seed draws the clients' calibration "
        "shares and the held-out text each run scores, so the dense model's score moves too. Each "
        "seed's perplexities side by side (seeds in the order of the third column); the claims "
        "above pool them.",
        "",
        "| cell | text | seeds | dense | global | standalone mean | centralized | "
        "global − standalone (% of standalone) |",
        "|---|---|---|---|---|---|---|---|",
        *rows,
        "",
    ]


def mask_agreement(grid_cells: list[Cell], runs: dict[str, Path]) -> list[str]:
    """Per run that recorded it: the share of the global mask's kept
    weights that 1..N sampling clients kept (the last round's `server-aggregate` row) and the share
    of them the centralized model keeps too (`fedspallm-mask-agreement`). Nothing for older runs."""
    rows = []
    for cell in grid_cells:
        if cell.tag not in runs:
            continue
        metrics = read_metrics(runs[cell.tag])
        kept_by = [r["global-kept-by"] for r in metrics if r.get("phase") == "server-aggregate"]
        central = [
            r["global-vs-centralized"]
            for r in metrics
            if r.get("phase") == "fedspallm-mask-agreement"
        ]
        if kept_by:
            shares = "; ".join(
                f"{n} clients: " + " / ".join(f"{100 * x:.1f}" for x in v[1:])
                for n, v in sorted(kept_by[-1].items(), key=lambda kv: int(kv[0]))
            )
            rows.append(
                f"| `{cell.tag}` | {shares} | "
                + (f"{100 * central[-1]:.1f}%" if central else "–")
                + " |"
            )
    if not rows:
        return []
    return [
        "## Mask agreement",
        "",
        "Of the weights the global mask keeps, the % that exactly 1 / 2 / … / N of the N clients "
        "that pruned the matrix kept (the last round's ℓ0 counts, Eq. 6), and the % that the "
        "centralized model keeps too.",
        "",
        "| run | kept by 1 / … / N clients (%) | centralized keeps |",
        "|---|---|---|",
        *rows,
        "",
    ]


def communication(grid_cells: list[Cell], runs: dict[str, Path]) -> list[str]:
    """Mean bytes per client and round, with layer sampling (comm cell) and without (Table 1 at
    50%)."""
    settings = [
        ("every layer (r_i = 1)", "table1-s50"),
        ("layer sampling (r_i = 0.5)", "comm-sampled"),
    ]
    lines = [
        "## Communication per client and round",
        "",
        "| setting | down (MB) | up (MB) | whole model fp32 (MB) | prunable matrices fp32 (MB) |",
        "|---|---|---|---|---|",
    ]
    for label, tag in settings:
        if tag not in runs:
            lines.append(f"| {label} | *not run* | | | |")
            continue
        rows = [
            r
            for r in read_metrics(runs[tag])
            if r.get("phase") == "train" and r.get("status") == "accepted"
        ]
        down = sum(r["bytes-down"] for r in rows) / len(rows)
        up = sum(r["bytes-up"] for r in rows) / len(rows)
        params = model_parameters(str(read_config(runs[tag]).get("model-name", "embedded")))
        whole = (
            "–" if params is None else f"{4 * params / 1e6:.1f}"
        )  # from the config: no weights archived
        prunable = 4 * json.loads((runs[tag] / "sparsity.json").read_text())["size"]
        lines.append(
            f"| {label} | {down / 1e6:.1f} | {up / 1e6:.1f} | {whole} | {prunable / 1e6:.1f} |"
        )
    lines += [
        "",
        "Down: the sampled layers' global weights (fp32). Up: their pruned weights (fp32, zeros "
        "included) and bool masks. The embeddings and norms never travel.",
    ]
    return lines
