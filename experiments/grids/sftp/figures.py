"""SFT-P's Figs. 3, 4b and 5 from the grid's +C/+A runs, written next to tables.md.

- Fig. 3, cross-client mask agreement (the +C/+A 50% run): per layer and mask, the share of bus
  coordinates on which all four clients choose the same gate (masks.json `agreement`, from
  `strategies.sftp.mask_statistics`), and one layer's mask as a heatmap clients × coordinates with
  an 'all agree' row (masks.npz; the paper shows layer 1).
- Fig. 4b, each client's kept ratio of the prunable projections per round vs its target p (±2%
  band): the `kept-ratio-prunable` / `keep-target` of the accepted `train` rows (the deterministic
  mask after the client's local steps) of every +C/+A run, the mixed-budget run included.
- Fig. 5, per-layer mask density for one client (the lowest partition id), the four masks
  (masks.json `density`), with that client's attn-in mask over layers × coordinates beside it when
  masks.npz is there.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from experiments.grids import Cell
from experiments.grids.sftp.cells import BUDGET_TOLERANCE, budget_label, tag_of
from experiments.grids.sftp.records import kept_series, read_masks, read_stats
from fedprune_app.structural.routing import mask_statistics

FIG3, FIG4B, FIG5 = (
    "fig3-sftp-mask-agreement.png",
    "fig4b-sftp-kept-ratio.png",
    "fig5-sftp-layer-density.png",
)
HEATMAP_LAYER, HEATMAP_MASK = 1, "attn-in"  # the paper's Fig. 3 shows layer 1
MASKS = ("attn-in", "attn-out", "ffn-in", "ffn-out")


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _integer_axis(axis: Any) -> None:
    from matplotlib.ticker import MaxNLocator

    axis.set_major_locator(MaxNLocator(integer=True))


def _per_layer_panel(ax: Any, series: dict[str, list[float]], ylabel: str) -> None:
    """One line per mask over the layers, y in [0, 1]: Fig. 3's agreement and Fig. 5's density."""
    for name in MASKS:
        ax.plot(range(len(series[name])), series[name], marker="o", ms=3, label=name)
    ax.set_xlabel("layer")
    _integer_axis(ax.xaxis)
    ax.set_ylabel(ylabel)
    ax.set_ylim(0, 1.02)
    ax.legend(fontsize=7)


def fig3(
    stats: dict[str, Any], masks: dict[int, dict[str, np.ndarray]] | None, path: Path
) -> tuple[Path, int]:
    """Agreement per layer (a line per mask) and, with masks.npz, one layer's mask heatmap; (path,
    layer shown)."""
    plt = _plt()
    fig, axes = plt.subplots(1, 2 if masks else 1, figsize=(10 if masks else 5, 3.4), squeeze=False)
    _per_layer_panel(axes[0][0], stats["agreement"], "share of coordinates all clients agree on")
    axes[0][0].set_title(f"mean agreement {stats['mean-agreement']:.3f}")
    layer = 0
    if masks:
        clients = sorted(masks)
        layer = min(HEATMAP_LAYER, masks[clients[0]][HEATMAP_MASK].shape[0] - 1)
        stack = np.stack([masks[c][HEATMAP_MASK][layer] for c in clients]).astype(float)
        agree = (stack.min(axis=0) == stack.max(axis=0)).astype(float)
        image = axes[0][1].imshow(
            np.vstack([stack, agree]), aspect="auto", interpolation="nearest", cmap="viridis"
        )
        axes[0][1].set_yticks(
            range(len(clients) + 1), [f"client {c}" for c in clients] + ["all agree"]
        )
        axes[0][1].set_xlabel("bus coordinate")
        axes[0][1].set_title(f"layer {layer} {HEATMAP_MASK}: agreement {agree.mean():.3f}")
        fig.colorbar(image, ax=axes[0][1], fraction=0.03)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path, layer


def fig4b(runs: list[tuple[str, Path]], path: Path) -> Path:
    """A panel per +C/+A run: kept ratio per client and round, each client's target dashed with a
    ±2% band."""
    plt = _plt()
    fig, axes = plt.subplots(
        1, len(runs), figsize=(4.2 * len(runs), 3.2), squeeze=False, sharey=True
    )
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, (title, run) in zip(axes[0], runs, strict=True):
        series, target = kept_series(run)
        for client, pts in series.items():
            colour = colours[client % len(colours)]
            ax.plot(
                [p[0] for p in pts],
                [p[1] for p in pts],
                marker="o",
                ms=3,
                color=colour,
                label=f"client {client}",
            )
        for p in sorted(set(target.values())):
            ax.axhspan(p - BUDGET_TOLERANCE, p + BUDGET_TOLERANCE, color="grey", alpha=0.2)
            ax.axhline(p, color="grey", linestyle="--", linewidth=0.8)
        ax.set_title(title)
        ax.set_xlabel("round")
        _integer_axis(ax.xaxis)
    axes[0][0].set_ylabel("kept ratio (prunable)")
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def fig5(
    stats: dict[str, Any], client: int, masks: dict[int, dict[str, np.ndarray]] | None, path: Path
) -> Path:
    """Per-layer density of the client's four masks (0.5 dashed), and its attn-in mask when
    masks.npz is there."""
    plt = _plt()
    have = masks is not None and client in masks
    fig, axes = plt.subplots(1, 2 if have else 1, figsize=(10 if have else 5, 3.4), squeeze=False)
    if have:
        axes[0][0].imshow(
            masks[client][HEATMAP_MASK], aspect="auto", interpolation="nearest", cmap="gray_r"
        )
        axes[0][0].set_xlabel("bus coordinate")
        axes[0][0].set_ylabel("layer")
        _integer_axis(axes[0][0].yaxis)
        axes[0][0].set_title(f"client {client} {HEATMAP_MASK} mask")
    ax = axes[0][-1]
    _per_layer_panel(ax, stats["density"][str(client)], "mask density (kept share)")
    ax.axhline(0.5, color="grey", linestyle="--", linewidth=0.8)
    ax.set_title(f"client {client}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def kept_table(title: str, run: Path) -> list[str]:
    series, target = kept_series(run)
    rounds = sorted({r for pts in series.values() for r, _ in pts})
    lines = [
        f"Kept ratio per client and round, {title}:",
        "",
        "| client (target) | " + " | ".join(f"round {r}" for r in rounds) + " |",
        "|---|" + "---|" * len(rounds),
    ]
    for client, pts in series.items():
        by_round = dict(pts)
        goal = f"{target[client]:.2f}" if client in target else "?"
        lines.append(
            f"| {client} ({goal}) | "
            + " | ".join(f"{by_round[r]:.3f}" if r in by_round else "–" for r in rounds)
            + " |"
        )
    return [*lines, ""]


def shared_cut_lines(grid_cells: list[Cell], runs: dict[str, Path]) -> list[str]:
    """Per SFT-P run with masks.npz and several clients: the clients' mean agreement (Fig. 3's
    number) and, per client, the share of its dropped coordinates that every client drops
    (`mask_statistics`' `shared-cut`)."""
    rows = []
    for c in grid_cells:
        masks = (
            read_masks(runs[c.tag]) if c.settings["method"] == "sftp" and c.tag in runs else None
        )
        if masks and len(masks) > 1:
            stats = mask_statistics(masks)
            cuts = " / ".join(f"{stats['shared-cut'][str(k)]:.3f}" for k in sorted(masks))
            rows.append(f"| `{c.tag}` | {stats['mean-agreement']:.3f} | {cuts} |")
    if not rows:
        return []
    return [
        "- How alike the clients' deployed masks are (masks.npz): mean agreement = share of (mask, "
        "layer, coordinate) on which all clients choose the same gate; shared cut = share of a "
        "client's dropped coordinates that every client drops (1 = one global mask).",
        "",
        "| run | mean agreement | shared cut, clients 0 / 1 / 2 / 3 |",
        "|---|---|---|",
        *rows,
        "",
    ]


def cut_overlap(
    a: dict[int, dict[str, np.ndarray]], b: dict[int, dict[str, np.ndarray]]
) -> tuple[float, float]:
    """(agreement, shared cut) of two runs' deployed masks, averaged over the clients both have: the
    share of (mask, layer, coordinate) with the same gate, and the share of run a's dropped
    coordinates that run b drops too. Two independent cuts that drop a share q each would share q of
    a's cut."""
    agree, shared = [], []
    for k in sorted(set(a) & set(b)):
        x = np.concatenate([np.asarray(a[k][n], bool).ravel() for n in sorted(a[k])])
        y = np.concatenate([np.asarray(b[k][n], bool).ravel() for n in sorted(a[k])])
        agree.append(float((x == y).mean()))
        shared.append(float((~x & ~y).sum() / max(int((~x).sum()), 1)))
    return float(np.mean(agree)), float(np.mean(shared))


def cross_run_lines(grid_cells: list[Cell], runs: dict[str, Path]) -> list[str]:
    """Per budget, each pair of finished SFT-P runs with masks.npz (variants and seed replicates):
    how alike their deployed masks are (`cut_overlap`). Within a run the clients' masks may be one
    mask (shared_cut_lines); this says whether that mask is the task's or the run's."""
    rows = []
    for budget in sorted(
        {c.settings["budget"] for c in grid_cells if c.settings["method"] == "sftp"}, key=str
    ):
        done = [
            (c.tag, m)
            for c in grid_cells
            if c.settings["method"] == "sftp"
            and c.settings["budget"] == budget
            and c.tag in runs
            and (m := read_masks(runs[c.tag]))
        ]
        for i, (tag_a, a) in enumerate(done):
            for tag_b, b in done[i + 1 :]:
                agree, shared = cut_overlap(a, b)
                rows.append(f"| `{tag_a}` | `{tag_b}` | {agree:.3f} | {shared:.3f} |")
    if not rows:
        return []
    return [
        "- How alike two runs' deployed masks are (masks.npz, averaged over clients): agreement = "
        "share of (mask, layer, coordinate) with the same gate; shared cut = share of the first "
        "run's dropped coordinates that the second drops too (two independent cuts at keep p "
        "share 1 − p).",
        "",
        "| run | other run | agreement | shared cut |",
        "|---|---|---|---|",
        *rows,
        "",
    ]


def figures(grid_cells: list[Cell], runs: dict[str, Path], out_dir: Path) -> str:
    """Draw Figs. 3, 4b and 5 into out_dir from the finished +C/+A cells; the Markdown section
    naming them."""
    lines = ["## Figures", ""]
    selected = {c.tag for c in grid_cells}
    half = tag_of("sftp", 0.5, "c-a")
    four_b = [
        (budget_label(c.settings["budget"]), runs[c.tag])
        for c in grid_cells
        if c.settings["method"] == "sftp"
        and c.settings["variant"] == "c-a"
        and c.tag in runs
        and "replicate-of" not in c.settings
    ]
    out_dir.mkdir(parents=True, exist_ok=True)
    stats = read_stats(runs[half]) if half in selected and half in runs else None
    masks = read_masks(runs[half]) if stats is not None else None
    if stats is None:
        lines.append(f"- Figs. 3 and 5 not drawn: no finished `{half}` run with masks.json.")
    else:
        path, layer = fig3(stats, masks, out_dir / FIG3)
        per_mask = ", ".join(f"{n} {np.mean(stats['agreement'][n]):.3f}" for n in MASKS)
        lines.append(
            f"- Fig. 3, cross-client mask agreement per layer (`{half}`): "
            f"[`{path.name}`]({path.name}); mean over layers and masks "
            f"{stats['mean-agreement']:.3f} (per mask: {per_mask})"
            + (f"; heatmap layer {layer} {HEATMAP_MASK}" if masks else "; no masks.npz: no heatmap")
            + "."
        )
        client = min(int(c) for c in stats["density"])
        path = fig5(stats, client, masks, out_dir / FIG5)
        spread = ", ".join(
            f"{n} {min(d):.3f}–{max(d):.3f}"
            for n in MASKS
            for d in [stats["density"][str(client)][n]]
        )
        lines.append(
            f"- Fig. 5, per-layer mask density of client {client} (`{half}`): "
            f"[`{path.name}`]({path.name}); range over layers: {spread}."
        )
    lines += shared_cut_lines(grid_cells, runs)
    lines += cross_run_lines(grid_cells, runs)
    if four_b:
        path = fig4b(four_b, out_dir / FIG4B)
        lines += [
            f"- Fig. 4b, kept ratio per client and round vs target (±{BUDGET_TOLERANCE} band), "
            f"+C/+A runs: [`{path.name}`]({path.name})",
            "",
        ]
        for title, run in four_b:
            lines += kept_table(title, run)
    else:
        lines += ["- Fig. 4b not drawn: no finished +C/+A run.", ""]
    return "\n".join(lines)
