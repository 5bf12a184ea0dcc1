"""The plots of a run: loss and metrics per round, per client and task (`<run>/plots/*.png`)."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fedprune_app.report.tables import (
    CHANCE,
    METRIC_NAMES,
    client_label,
    num_text,
    score_interval,
    short_name,
)

# Each plot's title and y-axis label, by its file name (`<phase>-<metric>`, or the train loss).
PLOT_TEXT = {
    "evaluate-acc": (
        "Multiple-choice accuracy on each client's test split",
        "accuracy (share of questions right)",
    ),
    "evaluate-acc_norm": (
        "Length-normalised multiple-choice accuracy on each client's test split",
        "accuracy, length-normalised",
    ),
    "evaluate-ppl": ("Perplexity on each client's test split", "perplexity (lower is better)"),
    "evaluate-rouge-l": (
        "Rouge-L of the generated answers on each client's test split",
        "Rouge-L F1 (0 to 1)",
    ),
    "evaluate-val-loss": (
        "Validation loss on each client's validation split",
        "loss (nats per answer token)",
    ),
    "train-loss": (
        "Training loss of each client, mean over the round's local steps",
        "loss (nats per token)",
    ),
    "train-val-loss": (
        "Validation loss of each client after its local training",
        "loss (nats per answer token)",
    ),
    "server-evaluate-ppl": (
        "Server: perplexity of the global model on held-out text",
        "perplexity (lower is better)",
    ),
}
SHARE_METRICS = ("acc", "acc_norm", "rouge-l")  # scores in [0, 1]: drawn on a 0-1 axis


def plot_series(
    records: list[dict[str, Any]],
) -> dict[str, dict[str, list[tuple[int, float, float | None, float | None]]]]:
    """{plot name: {series label: [(round, value, lo, hi), ...] sorted by round}} of every per-round
    score; a client's series is labelled `client_label`, the server's by its held-out text."""
    series: dict[str, dict[str, list[tuple[int, float, float | None, float | None]]]] = defaultdict(
        lambda: defaultdict(list)
    )
    for r in records:
        if r.get("status") in ("failed", "rejected") or "round" not in r:
            continue
        phase = str(r.get("phase"))
        who = (
            f"server: {short_name(str(r.get('data')))} text"
            if phase == "server-evaluate"
            else client_label(r.get("client"), r.get("data"))
        )
        for k, v in r.items():
            if k in (*METRIC_NAMES, "train-loss") and isinstance(v, int | float):
                lo, hi, _ = score_interval(r, k)
                name = k if k.startswith(phase) else f"{phase}-{k}"
                series[name][who].append((int(r["round"]), float(v), lo, hi))
    for lines in series.values():
        for pts in lines.values():
            pts.sort(key=lambda p: p[0])
    return series


def plot_rounds(records: list[dict[str, Any]], out_dir: Path) -> list[Path]:
    """One PNG per score: its value per round, one line per client (and the server), 95% intervals
    as error bars where known, chance accuracy dotted. A single round's score: a bar per client."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    out_dir.mkdir(parents=True, exist_ok=True)
    chance = {
        client_label(r.get("client"), r.get("data")): float(r[CHANCE])
        for r in records
        if r.get("phase") == "evaluate" and isinstance(r.get(CHANCE), int | float)
    }
    paths = []
    for name, lines in plot_series(records).items():
        title, ylabel = PLOT_TEXT.get(name, (name, name))
        metric = name.removeprefix("server-evaluate-").removeprefix("evaluate-")
        fig, ax = plt.subplots(figsize=(7, 4))
        rounds = sorted({p[0] for pts in lines.values() for p in pts})
        chances = chance if metric in ("acc", "acc_norm") else {}
        if len(rounds) == 1:
            _bars(ax, lines, chances)
            title += f", round {rounds[0]}"
        else:
            _lines(
                ax,
                lines,
                rounds,
                chances,
                "round" if name.startswith("train") else "round (0 = untouched model)",
            )
        values = [p[1] for pts in lines.values() for p in pts if math.isfinite(p[1])]
        if metric in SHARE_METRICS:
            ax.set_ylim(0, 1)
        elif values and min(values) > 0 and max(values) / min(values) > 20:
            ax.set_yscale("log")
            ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: num_text(v)))
        if any(_errors(pts) for pts in lines.values()):
            title += "\n(error bars: 95% intervals)"
        ax.set_title(title, fontsize=10)
        ax.set_ylabel(ylabel)
        ax.grid(axis="y", alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, loc="best")
        fig.tight_layout()
        path = out_dir / f"{name}.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        paths.append(path)
    return paths


def _errors(pts: list[tuple[int, float, float | None, float | None]]) -> Any:
    """matplotlib's yerr (2 × n distances below and above) where every point has an interval."""
    if not all(lo is not None and hi is not None for _, _, lo, hi in pts):
        return None
    return [[max(0.0, v - lo) for _, v, lo, _ in pts], [max(0.0, hi - v) for _, v, _, hi in pts]]


def _lines(
    ax: Any,
    lines: Mapping[str, list[tuple[int, float, float | None, float | None]]],
    rounds: list[int],
    chance: Mapping[str, float],
    xlabel: str,
) -> None:
    """A line per series; series side by side around each round so that their error bars do not hide
    each other; each client's chance accuracy dotted in its colour."""
    names = sorted(lines)
    gap = min((b - a for a, b in zip(rounds, rounds[1:], strict=False)), default=1)
    step = 0.06 * gap if any(_errors(pts) for pts in lines.values()) else 0.0
    for i, who in enumerate(names):
        pts, shift = lines[who], (i - (len(names) - 1) / 2) * step
        drawn = ax.errorbar(
            [p[0] + shift for p in pts],
            [p[1] for p in pts],
            yerr=_errors(pts),
            marker="o",
            capsize=3,
            label=who,
        )
        if who in chance:
            ax.axhline(
                chance[who],
                color=drawn[0].get_color(),
                linestyle=":",
                linewidth=1.2,
                label=f"chance, {who.split(' (')[0]} ({chance[who]:.2f})",
            )
    ax.set_xlabel(xlabel)
    if len(rounds) <= 20:
        ax.set_xticks(rounds)
    else:
        from matplotlib.ticker import MaxNLocator

        ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _bars(
    ax: Any,
    lines: Mapping[str, list[tuple[int, float, float | None, float | None]]],
    chance: Mapping[str, float],
) -> None:
    """One bar per series (its single point), its value above it and its chance accuracy dotted."""
    names = sorted(lines)
    pts = [lines[who][-1] for who in names]
    ax.bar(
        range(len(names)),
        [p[1] for p in pts],
        yerr=_errors(pts),
        capsize=4,
        color=[f"C{i}" for i in range(len(names))],
    )
    labelled = False
    for i, (who, p) in enumerate(zip(names, pts, strict=True)):
        ax.annotate(
            num_text(p[1]), (i, p[1]), textcoords="offset points", xytext=(8, 3), fontsize=8
        )
        if who in chance:
            ax.hlines(
                chance[who],
                i - 0.4,
                i + 0.4,
                colors="black",
                linestyles=":",
                label=None if labelled else "chance",
            )
            labelled = True
    ax.set_xticks(range(len(names)), names, fontsize=8, rotation=15 if len(names) > 3 else 0)
