"""FedTPA's Tables II–IV, its claims and the communication per client and round, on this app.

Every cell is one run of `conf/fedtpa.toml`, `conf/flexlora.toml` or `conf/fedit-instructions.toml` (the
presets differ only in their method keys) with 5 SuperNodes and the partition set: α = 0.5 or 1 (Dirichlet over
the task categories) or inf (`partitioner = "iid"`). Table II: α × {FedIT, FlexLoRA, FedTPA}. Table III: LCWA (the
Table II FedTPA cell, not run twice) vs FedAvg (`fedtpa-lcwa = false`) at each α. Table IV at α = 0.5: full,
−ITPA, −DAPR, −LCWA (the Table III FedAvg cell). Communication: the `bytes-up` / `bytes-down` of the Table II
cells' accepted train rows (no extra runs). Rouge-L: the run's federated evaluation of the global adapter on the
global test split in its last round (metrics.jsonl `evaluate` rows), ×100 as in the paper. Figures 4–5:
fedtpa_figures.py.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tools.grids import Cell, Grid, mark, plan, read_config, read_metrics, runs_section, selected_groups
from tools.rescore import RESCORE_FILE

PRESETS = {"fedit": "conf/fedit-instructions.toml", "flexlora": "conf/flexlora.toml", "fedtpa": "conf/fedtpa.toml"}
LABELS = {"fedit": "FedIT", "flexlora": "FlexLoRA", "fedtpa": "FedTPA"}
VARIANTS = {"": "", "fedavg": "fedtpa-lcwa=false", "no-itpa": "fedtpa-itpa=false", "no-dapr": "fedtpa-dapr=false"}
ABLATIONS = (("", "ITPA + DAPR + LCWA (full)"), ("no-itpa", "DAPR + LCWA (−ITPA)"),
             ("no-dapr", "ITPA + LCWA (−DAPR)"), ("fedavg", "ITPA + DAPR (−LCWA, FedAvg)"))
GROUPS = ("table2", "table3", "table4", "comm")
CLIENTS = 5
TABLE4_ALPHA = 0.5
NON_IID = (0.5, 1.0)


@dataclass(frozen=True)
class FigureGrid(Grid):
    """A grid that also draws figures next to tables.md: figures(cells, runs, out_dir) -> Markdown section."""

    figures: Callable[[list[Cell], dict[str, Path], Path], str] | None = None


def alpha_name(alpha: float) -> str:
    return "inf" if math.isinf(alpha) else f"{alpha:g}"


def tag_of(method: str, alpha: float, variant: str = "") -> str:
    return f"a{alpha_name(alpha)}-{method}" + (f"-{variant}" if variant else "")


def overrides(alpha: float, variant: str) -> str:
    part = 'partitioner="iid"' if math.isinf(alpha) else f'partitioner="dirichlet" dirichlet-alpha={alpha}'
    return " ".join(x for x in (part, f"min-nodes={CLIENTS}", VARIANTS[variant]) if x)


def cells(args: Any) -> list[Cell]:
    """The cells the selected groups need (`--only`, `--alphas`); a cell several groups read is run once."""
    alphas = [float(a) for a in str(getattr(args, "alphas", "0.5,1,inf")).split(",") if a.strip()]
    only = selected_groups(args, GROUPS, "FedTPA")
    needs = [(g, (m, a, "")) for a in alphas for m in PRESETS for g in ("table2", "comm")]
    needs += [("table3", ("fedtpa", a, v)) for a in alphas for v in ("", "fedavg")]
    needs += [("table4", ("fedtpa", TABLE4_ALPHA, v)) for v, _ in ABLATIONS]
    return [Cell(groups[0], tag_of(m, a, v), (PRESETS[m], overrides(a, v)), CLIENTS,
                 {"method": m, "alpha": a, "variant": v, "groups": groups})
            for (m, a, v), groups in plan(only, GROUPS, needs).items()]


# --- reading the runs -----------------------------------------------------------------------------------------

def final_rouge(run_dir: Path, round_: int | None = None) -> float | None:
    """Mean Rouge-L of the `evaluate` rows of the run's last round (or `round_`), None when that round has none.
    The presets let one client evaluate (every client would score the same global test split)."""
    if round_ is None:
        round_ = int(read_config(run_dir)["num-server-rounds"])
    vals = [float(r["rouge-l"]) for r in read_metrics(run_dir)
            if r.get("phase") == "evaluate" and r.get("status") == "ok" and r.get("round") == round_
            and isinstance(r.get("rouge-l"), int | float)]
    return sum(vals) / len(vals) if vals else None


def train_rows(run_dir: Path) -> list[dict[str, Any]]:
    return [r for r in read_metrics(run_dir) if r.get("phase") == "train" and r.get("status") == "accepted"]


def rouge_table(grid_cells: list[Cell], runs: dict[str, Path]) -> dict[str, float | None]:
    """{tag: final-round Rouge-L ×100} for every cell (None: not run, or no final evaluation)."""
    out: dict[str, float | None] = {}
    for c in grid_cells:
        value = final_rouge(runs[c.tag]) if c.tag in runs else None
        out[c.tag] = None if value is None else 100 * value
    return out


def fmt(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}"


# --- tables and claims ----------------------------------------------------------------------------------------

def judge(pairs: list[tuple[str, float | None, float | None, Callable[[float, float], bool]]]) -> tuple[
        bool | None, str]:
    """(held?, evidence) of comparisons (label, a, b, ok(a, b)): not held as soon as one measured pair fails,
    not checked while a needed cell is missing, else held."""
    measured = [(label, a, b, ok(a, b)) for label, a, b, ok in pairs if a is not None and b is not None]
    missing = [label for label, a, b, _ in pairs if a is None or b is None]
    held = False if any(not good for *_, good in measured) else (None if missing or not pairs else True)
    text = "; ".join(f"{label}: {a:.2f} vs {b:.2f}" + ("" if good else " ✗") for label, a, b, good in measured)
    if missing:
        text += ("; " if text else "") + "missing: " + ", ".join(missing)
    return held, text


Interval = Callable[[str, str | None], str]  # (tag, paired-with tag or None) -> " [lo, hi]" or ""


def rescored_table(grid_cells: list[Cell], runs: dict[str, Path]) -> dict[str, list[float]]:
    """{tag: per-example Rouge-L} of the cells whose run has a rescore.json (tools/rescore_rouge.py)."""
    out = {}
    for c in grid_cells:
        path = runs[c.tag] / RESCORE_FILE if c.tag in runs else None
        if path is not None and path.is_file():
            out[c.tag] = [float(x) for x in json.loads(path.read_text())["scores"]]
    return out


def bootstrap_interval(scores: dict[str, list[float]]) -> Interval:
    """A cell's bootstrap 95% interval (×100), or the paired one of its difference to another cell."""
    from fedprune_app.llm.evaluation import bootstrap_ci

    def interval(tag: str, other: str | None) -> str:
        if tag not in scores or (other is not None and (other not in scores
                                                         or len(scores[other]) != len(scores[tag]))):
            return ""
        _, lo, hi = bootstrap_ci(scores[tag], None if other is None else scores[other])
        return f" [{100 * lo:.2f}, {100 * hi:.2f}]"

    return interval


def score_sections(groups: set[str], alphas: list[float], score: dict[str, float | None], interval: Interval,
                   runs: dict[str, Path] | None = None, heading: str = "") -> list[str]:
    """Tables II–IV and the claims for one set of Rouge-L scores ({tag: ×100}); `interval` adds bootstrap
    intervals (nothing for the in-run scores); `runs` given: Table II shows the untouched model (round 0)."""

    def r(method: str, alpha: float, variant: str = "") -> float | None:
        return score.get(tag_of(method, alpha, variant))

    def ci(a: tuple[Any, ...], b: tuple[Any, ...] | None = None) -> str:
        return interval(tag_of(*a), None if b is None else tag_of(*b))

    ge, le = (lambda a, b: a >= b), (lambda a, b: a < b)
    lines: list[str] = []
    if "table2" in groups:
        lines += [f"## Table II: FedIT, FlexLoRA, FedTPA{heading}", "",
                  "| α | FedIT | FlexLoRA | FedTPA |" + (" untouched (round 0) |" if runs is not None else ""),
                  "|---|---|---|---|" + ("---|" if runs is not None else "")]
        for a in alphas:
            row = f"| {alpha_name(a)} | " + " | ".join(fmt(r(m, a)) + ci((m, a)) for m in PRESETS) + " |"
            if runs is not None:
                run = runs.get(tag_of("fedtpa", a))
                untouched = final_rouge(run, 0) if run is not None else None
                row += f" {fmt(None if untouched is None else 100 * untouched)} |"
            lines.append(row)
        lines.append("")
    if "table3" in groups:
        lines += [f"## Table III: LCWA vs FedAvg aggregation (FedTPA){heading}", "", "| α | LCWA | FedAvg (Δ) |",
                  "|---|---|---|"]
        for a in alphas:
            lcwa, avg = r("fedtpa", a), r("fedtpa", a, "fedavg")
            delta = (f" ({avg - lcwa:+.2f}{ci(('fedtpa', a, 'fedavg'), ('fedtpa', a))})"
                     if lcwa is not None and avg is not None else "")
            lines.append(f"| {alpha_name(a)} | {fmt(lcwa)} | {fmt(avg)}{delta} |")
        lines.append("")
    if "table4" in groups:
        full = r("fedtpa", TABLE4_ALPHA)
        lines += [f"## Table IV: component ablations (α = {alpha_name(TABLE4_ALPHA)}){heading}", "",
                  "| combination | Rouge-L (Δ vs full) |", "|---|---|"]
        for variant, label in ABLATIONS:
            v = r("fedtpa", TABLE4_ALPHA, variant)
            delta = (f" ({v - full:+.2f}{ci(('fedtpa', TABLE4_ALPHA, variant), ('fedtpa', TABLE4_ALPHA))})"
                     if variant and v is not None and full is not None else "")
            lines.append(f"| {label} | {fmt(v)}{delta} |")
        lines.append("")
    lines += [f"## Claims{heading}", ""]
    if "table2" in groups:
        pairs = [(f"α={alpha_name(a)} FedTPA vs {LABELS[m]}" + paired(ci(("fedtpa", a), (m, a))),
                  r("fedtpa", a), r(m, a), ge) for a in NON_IID for m in ("fedit", "flexlora")]
        held, text = judge(pairs)
        lines.append(f"- FedTPA ≥ FedIT and ≥ FlexLoRA under non-IID α (0.5 and 1): {mark(held)} ({text}).")
    if "table3" in groups:
        held, text = judge([(f"α={alpha_name(a)} FedAvg vs LCWA" + paired(ci(("fedtpa", a, "fedavg"), ("fedtpa", a))),
                             r("fedtpa", a, "fedavg"), r("fedtpa", a), le) for a in alphas])
        lines.append(f"- FedAvg aggregation scores below LCWA at every α (Table III): {mark(held)} ({text}).")
    if "table4" in groups:
        full = r("fedtpa", TABLE4_ALPHA)
        held, text = judge([(label.split(" (")[1].rstrip(")") + " vs full"
                             + paired(ci(("fedtpa", TABLE4_ALPHA, v), ("fedtpa", TABLE4_ALPHA))),
                             r("fedtpa", TABLE4_ALPHA, v), full, le) for v, label in ABLATIONS if v])
        lines.append(f"- Each component removed costs Rouge-L (−ITPA, −DAPR, −LCWA each < full): {mark(held)} "
                     f"({text}).")
    return lines


def paired(interval: str) -> str:
    return f" (Δ 95% CI{interval})" if interval else ""


def render(grid_cells: list[Cell], runs: dict[str, Path]) -> str:
    groups = {g for c in grid_cells for g in c.settings["groups"]}
    alphas = list(dict.fromkeys(c.settings["alpha"] for c in grid_cells if "table2" in c.settings["groups"]
                                or "table3" in c.settings["groups"]))
    lines = ["# FedTPA on this app: the paper's Tables II–IV, claims and communication", "",
             "Rouge-L F1 ×100 (the paper's scale) of greedy answers on the global test split, after the last round, "
             "read from each run's metrics.jsonl (`evaluate` rows; one client evaluates: every client would score "
             "the same split). α: Dirichlet concentration over the task categories; inf = IID. 5 clients each. "
             "Run directories at the end.", ""]
    lines += score_sections(groups, alphas, rouge_table(grid_cells, runs), lambda *_: "", runs)
    wide = rescored_table(grid_cells, runs)
    if wide:
        sizes = sorted({len(v) for v in wide.values()})
        lines += ["", f"# Re-scored on {'/'.join(map(str, sizes))} unused examples", "",
                  "The same final models scored by `tools/rescore_rouge.py` on examples of the same source that "
                  "no split of the runs read (the seeded shuffle's tail after test | val | train), identical for "
                  "every run: mean Rouge-L ×100 with a bootstrap 95% interval; a Δ's interval is paired (the two "
                  "runs resampled on the same examples). A claim is judged on the means; an interval that "
                  "straddles 0 says the ranking is within noise.", ""]
        lines += score_sections(groups, alphas, {t: 100 * sum(v) / len(v) for t, v in wide.items()},
                                bootstrap_interval(wide), heading=" (re-scored)")
    if "comm" in groups:
        lines += ["", *communication(grid_cells, runs)]
    lines += ["", *runs_section(grid_cells, runs)]
    return "\n".join(lines) + "\n"


def communication(grid_cells: list[Cell], runs: dict[str, Path]) -> list[str]:
    """Bytes per client and round (accepted train replies) of the Table II cells: mean, and each client's mean."""
    lines = ["## Communication per client and round", "",
             "| method | α | up, mean (KB) | up per client 0…4 (KB) | down, mean (KB) |", "|---|---|---|---|---|"]
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
        order = sorted(per_client, key=lambda k: (not isinstance(k, int), k if isinstance(k, int) else 0))
        each = " · ".join(f"{sum(per_client[k]) / len(per_client[k]) / 1e3:.1f}" for k in order)
        lines.append(f"{label} {up / 1e3:.1f} | {each} | {down / 1e3:.1f} |")
    lines += ["", "Up: the adapter tensors a client returns (fp32) and its metrics; FlexLoRA at the client's own rank "
              "(8–64), FedTPA only the kept dimensions plus its N×r_g pruning log and N layer scores (FedTPA's "
              "one-off feature vector before round 1 is not a train reply). Down: the global adapter sent "
              "(FedIT and FedTPA at r_g = 16, FlexLoRA at the client's rank once known)."]
    return lines


def _figures(grid_cells: list[Cell], runs: dict[str, Path], out_dir: Path) -> str:
    from tools.grids.fedtpa_figures import figures

    return figures(grid_cells, runs, out_dir)


GRID = FigureGrid("fedtpa", "fedtpa", cells, render, _figures)
