"""FedTPA's Figs. 4–5 from the grid's FedTPA runs (one panel per α), written next to tables.md.

- Fig. 4: each client's local train loss (solid; mean over the round's local steps) and validation
  loss (dashed; after the round's fine-tuning) per round: the `train-loss` / `val-loss` of the
  accepted `train` rows of metrics.jsonl (the paper logs four points per round; a run here logs
  one).
- Fig. 5: each client's keep-ratio β per round: the `beta` a client trained with in that round (its
  train row; round 1 = ITPA's β¹, later rounds = DAPR's updates).
"""

from __future__ import annotations

from pathlib import Path

from experiments.grids import Cell
from experiments.grids.fedtpa.cells import alpha_name
from experiments.grids.fedtpa.records import series

FIG4, FIG5 = "fig4-fedtpa-loss.png", "fig5-fedtpa-beta.png"


def _panels(
    runs: list[tuple[float, Path]], keys: list[tuple[str, str]], ylabel: str, path: Path
) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, axes = plt.subplots(
        1, len(runs), figsize=(4.2 * len(runs), 3.2), squeeze=False, sharey=True
    )
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, (alpha, run) in zip(axes[0], runs, strict=True):
        for key, style in keys:
            for client, pts in series(run, key).items():
                ax.plot(
                    [p[0] for p in pts],
                    [p[1] for p in pts],
                    style,
                    marker="o",
                    ms=3,
                    color=colours[client % len(colours)],
                    label=f"client {client}" if style == "-" else None,
                )
        ax.set_title(f"α = {alpha_name(alpha)}")
        ax.set_xlabel("round")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes[0][0].set_ylabel(ylabel)
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def beta_table(alpha: float, run: Path) -> list[str]:
    betas = series(run, "beta")
    rounds = sorted({r for pts in betas.values() for r, _ in pts})
    lines = [
        f"β per client and round, α = {alpha_name(alpha)}:",
        "",
        "| client | " + " | ".join(f"round {r}" for r in rounds) + " |",
        "|---|" + "---|" * len(rounds),
    ]
    for client, pts in betas.items():
        by_round = dict(pts)
        lines.append(
            f"| {client} | "
            + " | ".join(f"{by_round[r]:.3f}" if r in by_round else "–" for r in rounds)
            + " |"
        )
    return [*lines, ""]


def figures(grid_cells: list[Cell], runs: dict[str, Path], out_dir: Path) -> str:
    """Draw Figs. 4–5 into out_dir from the finished full-FedTPA cells; the Markdown section naming
    them."""
    full = [
        (c.settings["alpha"], runs[c.tag])
        for c in grid_cells
        if c.settings["method"] == "fedtpa" and not c.settings["variant"] and c.tag in runs
    ]
    lines = ["## Figures", ""]
    if not full:
        return "\n".join(
            [*lines, "Not drawn: no finished FedTPA cell (Table II's FedTPA column).", ""]
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    fig4 = _panels(
        full,
        [("train-loss", "-"), ("val-loss", "--")],
        "local loss (solid train, dashed val)",
        out_dir / FIG4,
    )
    fig5 = _panels(full, [("beta", "-")], "keep-ratio β", out_dir / FIG5)
    lines += [
        "- Fig. 4, local train/validation loss per client and round (FedTPA): "
        f"[`{fig4.name}`]({fig4.name})",
        f"- Fig. 5, keep-ratio β per client and round (FedTPA): [`{fig5.name}`]({fig5.name})",
        "",
    ]
    for alpha, run in full:
        lines += beta_table(alpha, run)
    return "\n".join(lines)
