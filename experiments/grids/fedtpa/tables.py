"""FedTPA's Tables II–IV, the claims (in-run and re-scored) and the communication table, from the
records."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from experiments.grids import Cell, Interval, judge, mark, runs_section, train_rows
from experiments.grids.fedtpa.cells import (
    ABLATIONS,
    LABELS,
    NON_IID,
    PRESETS,
    TABLE4_ALPHA,
    alpha_name,
    tag_of,
)
from experiments.grids.fedtpa.records import final_rouge, rescored_table, rouge_curve, rouge_table


def fmt(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}"


IntervalOf = Callable[
    [str, str | None], Interval | None
]  # (tag, paired-with tag or None) -> 95% interval (×100)


def shown(interval: Interval | None) -> str:
    return "" if interval is None else f" [{interval[0]:.2f}, {interval[1]:.2f}]"


def bootstrap_interval(scores: dict[str, list[float]]) -> IntervalOf:
    """A cell's bootstrap 95% interval (×100), or the paired one of its difference to another
    cell."""
    from fedprune_app.llm.evaluation import bootstrap_ci

    def interval(tag: str, other: str | None) -> Interval | None:
        if tag not in scores or (
            other is not None and (other not in scores or len(scores[other]) != len(scores[tag]))
        ):
            return None
        _, lo, hi = bootstrap_ci(scores[tag], None if other is None else scores[other])
        return 100 * lo, 100 * hi, len(scores[tag])

    return interval


def score_sections(
    groups: set[str],
    alphas: list[float],
    score: dict[str, float | None],
    interval: IntervalOf,
    runs: dict[str, Path] | None = None,
    heading: str = "",
) -> list[str]:
    """Tables II–IV and the claims for one set of Rouge-L scores ({tag: ×100}); `interval` adds
    bootstrap intervals (nothing for the in-run scores); `runs` given: Table II shows the untouched
    model (round 0)."""

    def r(method: str, alpha: float, variant: str = "") -> float | None:
        return score.get(tag_of(method, alpha, variant))

    def ci(a: tuple[Any, ...], b: tuple[Any, ...] | None = None) -> Interval | None:
        return interval(tag_of(*a), None if b is None else tag_of(*b))

    ge, le = (lambda a, b: a >= b), (lambda a, b: a < b)
    lines: list[str] = []
    if "table2" in groups:
        lines += [
            f"## Table II: FedIT, FlexLoRA, FedTPA{heading}",
            "",
            "| α | FedIT | FlexLoRA | FedTPA |"
            + (" untouched (round 0) |" if runs is not None else ""),
            "|---|---|---|---|" + ("---|" if runs is not None else ""),
        ]
        for a in alphas:
            row = (
                f"| {alpha_name(a)} | "
                + " | ".join(fmt(r(m, a)) + shown(ci((m, a))) for m in PRESETS)
                + " |"
            )
            if runs is not None:
                run = runs.get(tag_of("fedtpa", a))
                untouched = final_rouge(run, 0) if run is not None else None
                row += f" {fmt(None if untouched is None else 100 * untouched)} |"
            lines.append(row)
        lines.append("")
    if "table3" in groups:
        lines += [
            f"## Table III: LCWA vs FedAvg aggregation (FedTPA){heading}",
            "",
            "| α | LCWA | FedAvg (Δ) |",
            "|---|---|---|",
        ]
        for a in alphas:
            lcwa, avg = r("fedtpa", a), r("fedtpa", a, "fedavg")
            delta = (
                f" ({avg - lcwa:+.2f}{shown(ci(('fedtpa', a, 'fedavg'), ('fedtpa', a)))})"
                if lcwa is not None and avg is not None
                else ""
            )
            lines.append(f"| {alpha_name(a)} | {fmt(lcwa)} | {fmt(avg)}{delta} |")
        lines.append("")
    if "table4" in groups:
        full = r("fedtpa", TABLE4_ALPHA)
        lines += [
            f"## Table IV: component ablations (α = {alpha_name(TABLE4_ALPHA)}){heading}",
            "",
            "| combination | Rouge-L (Δ vs full) |",
            "|---|---|",
        ]
        for variant, label in ABLATIONS:
            v = r("fedtpa", TABLE4_ALPHA, variant)
            delta = (
                f" ({v - full:+.2f}"
                f"{shown(ci(('fedtpa', TABLE4_ALPHA, variant), ('fedtpa', TABLE4_ALPHA)))})"
                if variant and v is not None and full is not None
                else ""
            )
            lines.append(f"| {label} | {fmt(v)}{delta} |")
        lines.append("")
    lines += [
        f"## Claims{heading}",
        "",
        "Each comparison: a vs b (Δ = a − b, its 95% interval, n = the examples behind a). Held: "
        "the claim holds over the whole interval; not held: nowhere on it; unresolved: the "
        "interval straddles 0, or there is no interval (the in-run scores have none: the re-scored "
        "claims decide).",
        "",
    ]
    if "table2" in groups:
        pairs = [
            (
                f"α={alpha_name(a)} FedTPA vs {LABELS[m]}",
                r("fedtpa", a),
                r(m, a),
                ge,
                ci(("fedtpa", a), (m, a)),
            )
            for a in NON_IID
            for m in ("fedit", "flexlora")
        ]
        held, text = judge(pairs)
        lines.append(
            f"- FedTPA ≥ FedIT and ≥ FlexLoRA under non-IID α (0.5 and 1): {mark(held)} ({text})."
        )
    if "table3" in groups:
        held, text = judge(
            [
                (
                    f"α={alpha_name(a)} FedAvg vs LCWA",
                    r("fedtpa", a, "fedavg"),
                    r("fedtpa", a),
                    le,
                    ci(("fedtpa", a, "fedavg"), ("fedtpa", a)),
                )
                for a in alphas
            ]
        )
        lines.append(
            f"- FedAvg aggregation scores below LCWA at every α (Table III): {mark(held)} ({text})."
        )
    if "table4" in groups:
        full = r("fedtpa", TABLE4_ALPHA)
        held, text = judge(
            [
                (
                    label.split(" (")[1].rstrip(")") + " vs full",
                    r("fedtpa", TABLE4_ALPHA, v),
                    full,
                    le,
                    ci(("fedtpa", TABLE4_ALPHA, v), ("fedtpa", TABLE4_ALPHA)),
                )
                for v, label in ABLATIONS
                if v
            ]
        )
        lines.append(
            "- Each component removed costs Rouge-L (−ITPA, −DAPR, −LCWA each < full): "
            f"{mark(held)} ({text})."
        )
    return lines


def render(grid_cells: list[Cell], runs: dict[str, Path]) -> str:
    groups = {g for c in grid_cells for g in c.settings["groups"]}
    alphas = list(
        dict.fromkeys(
            c.settings["alpha"]
            for c in grid_cells
            if "table2" in c.settings["groups"] or "table3" in c.settings["groups"]
        )
    )
    lines = [
        "# FedTPA on this app: the paper's Tables II–IV, claims and communication",
        "",
        "Rouge-L F1 ×100 (the paper's scale) of greedy answers on the global test split, after the "
        "last round, read from each run's metrics.jsonl (`evaluate` rows; one client evaluates: "
        "every client would score the same split). α: Dirichlet concentration over the task "
        "categories; inf = IID. 5 clients each. Run directories at the end.",
        "",
    ]
    lines += score_sections(groups, alphas, rouge_table(grid_cells, runs), lambda *_: None, runs)
    lines += curve(grid_cells, runs)
    wide = rescored_table(grid_cells, runs)
    if wide:
        sizes = sorted({len(v) for v in wide.values()})
        lines += [
            "",
            f"# Re-scored on {'/'.join(map(str, sizes))} unused examples",
            "",
            "The same final models scored by `fedprune rescore rouge` on examples of the same "
            "source that no split of the runs read (the seeded shuffle's tail after test | val | "
            "train), identical for every run: mean Rouge-L ×100 with a bootstrap 95% interval; a "
            "Δ's interval is paired (the two runs resampled on the same examples). A claim is "
            "judged on the intervals: one that straddles 0 leaves it unresolved.",
            "",
        ]
        lines += score_sections(
            groups,
            alphas,
            {t: 100 * sum(v) / len(v) for t, v in wide.items()},
            bootstrap_interval(wide),
            heading=" (re-scored)",
        )
    if "comm" in groups:
        lines += ["", *communication(grid_cells, runs)]
    lines += ["", *runs_section(grid_cells, runs)]
    return "\n".join(lines) + "\n"


def curve(grid_cells: list[Cell], runs: dict[str, Path]) -> list[str]:
    """Rouge-L ×100 after every evaluated round of each run (in-run, no interval), when some run
    evaluated more than round 0 and its last: the curve that shows whether the score still changes
    when the run stops (§IV runs 15)."""
    curves = {c.tag: rouge_curve(runs[c.tag]) for c in grid_cells if c.tag in runs}
    if not any(len(v) > 2 for v in curves.values()):
        return []
    rounds = sorted({t for v in curves.values() for t in v})
    lines = [
        "",
        "## Rouge-L by evaluated round (in-run)",
        "",
        "Mean Rouge-L ×100 on the in-run test examples after each evaluated round (`eval-every`); "
        "the last column is the change over the last evaluated interval. In-run means have no "
        "interval: the re-scored tables decide the claims.",
        "",
        "| cell | " + " | ".join(f"round {t}" for t in rounds) + " | last change |",
        "|---|" + "---|" * (len(rounds) + 1),
    ]
    for tag, values in curves.items():
        last = list(values.values())[-2:]
        change = f"{last[1] - last[0]:+.2f}" if len(last) == 2 else "–"
        lines.append(
            f"| {tag} | " + " | ".join(fmt(values.get(t)) for t in rounds) + f" | {change} |"
        )
    return lines


def communication(grid_cells: list[Cell], runs: dict[str, Path]) -> list[str]:
    """Bytes per client and round (accepted train replies) of the Table II cells: mean, and each
    client's mean."""
    lines = [
        "## Communication per client and round",
        "",
        "| method | α | up, mean (KB) | up per client 0…4 (KB) | down, mean (KB) |",
        "|---|---|---|---|---|",
    ]
    for c in grid_cells:
        if "comm" not in c.settings["groups"]:
            continue
        label = f"| {LABELS[c.settings['method']]} | {alpha_name(c.settings['alpha'])} |"
        rows = train_rows(runs[c.tag]) if c.tag in runs else []
        if not rows:
            lines.append(f"{label} *not run* | | |")
            continue
        per_client: dict[Any, list[float]] = defaultdict(list)
        for row in rows:
            per_client[row.get("client")].append(float(row["bytes-up"]))
        up = sum(float(x["bytes-up"]) for x in rows) / len(rows)
        down = sum(float(x["bytes-down"]) for x in rows) / len(rows)
        order = sorted(
            per_client, key=lambda k: (not isinstance(k, int), k if isinstance(k, int) else 0)
        )
        each = " · ".join(f"{sum(per_client[k]) / len(per_client[k]) / 1e3:.1f}" for k in order)
        lines.append(f"{label} {up / 1e3:.1f} | {each} | {down / 1e3:.1f} |")
    lines += [
        "",
        "Up: the adapter tensors a client returns (fp32) and its metrics; FlexLoRA at the client's "
        "own rank (8–64), FedTPA only the kept dimensions plus its N×r_g pruning log and N layer "
        "scores (FedTPA's one-off feature vector before round 1 is not a train reply). Down: the "
        "global adapter sent (FedIT and FedTPA at r_g = 16, FlexLoRA at the client's rank "
        "once known).",
    ]
    return lines
