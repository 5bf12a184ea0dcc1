"""Table 1's size and speed columns: each deployed model's parameters and its measured speed-up
against its FLOP ceiling, read from the `compiled` rows the runs wrote
(`fedprune_app.structural.speed.speed_table`: dense and compiled timed round-robin in the server
process at the end of the run, medians of 3).

SFT-P deploys one compiled model per client; LLM-Pruner (FL) and SliceGPT (FL) one global model.
fedflap's run does not time its compiled model (its masks have SFT-P's shape; its size follows from
its kept ratio), so it has no row here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from experiments.grids import Cell, read_metrics
from experiments.grids.sftp.cells import BASELINES, BUDGETS, VARIANTS, budget_label, tag_of


def compiled_rows(run_dir: Path) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """(the dense row, the deployed models' rows) of a run's `compiled` phase."""
    rows = [r for r in read_metrics(run_dir) if r.get("phase") == "compiled"]
    dense = next((r for r in rows if r.get("model") == "dense"), None)
    return dense, [r for r in rows if r.get("model") != "dense"]


def span(rows: list[dict[str, Any]], key: str, digits: int = 2, suffix: str = "") -> str:
    """One value, or 'min–max' over the deployed models (SFT-P: one per client)."""
    vals = [float(r[key]) for r in rows if isinstance(r.get(key), (int, float))]
    if not vals:
        return "–"
    lo, hi = min(vals), max(vals)
    return (
        f"{lo:.{digits}f}{suffix}"
        if f"{lo:.{digits}f}" == f"{hi:.{digits}f}"
        else f"{lo:.{digits}f}–{hi:.{digits}f}{suffix}"
    )


def size_row(label: str, run_dir: Path) -> str | None:
    dense, rows = compiled_rows(run_dir)
    if dense is None or not rows:
        return None
    params = [dict(r, **{"params-m": float(r["params"]) / 1e6}) for r in rows if "params" in r]
    return (
        f"| {label} | {len(rows)} | {span(params, 'params-m', 1)} | "
        f"{span(rows, 'params-ratio', 3)} | {int(dense.get('prefill-tokens', 0))} | "
        f"{span(rows, 'prefill-speedup', 2, '×')} | {span(rows, 'prefill-ceiling', 2, '×')} | "
        f"{span(rows, 'generate-speedup', 2, '×')} | {span(rows, 'generate-ceiling', 2, '×')} |"
    )


def size_and_speed(grid_cells: list[Cell], runs: dict[str, Path]) -> list[str]:
    """Per budget, every timed run: models deployed, parameters (M, and / the dense model's),
    prefill and generation speed-up with its FLOP ceiling (min–max over SFT-P's per-client
    models)."""
    tags = {c.tag for c in grid_cells}
    lines = [
        "## Table 1, size and speed: the deployed models",
        "",
        "Parameters of each deployed model and its speed-up over the dense model, timed in the "
        "run's server process at its end (prefill of the prompt length shown, last-token logits; "
        "generation of 32 tokens after 32; batch 1; medians of 3, round-robin with the dense "
        "model). The ceiling is the FLOP ratio of the same workload (`speed.workload_flops`). The "
        "timings share the machine with whatever else ran then and move by 10–60% between runs "
        "(isolated timings of the deployed models: `fedprune bench deployed`, "
        "docs/methods/sftp.md, 'Speed of the deployed models in the grid'); the parameters and "
        "ceilings do not move. Generation above its ceiling is the compiled layout's own gain "
        "(docs/methods/sftp.md, 'Speed of the compiled models'). SFT-P: min–max over its four "
        "per-client models. fedflap does not time its model (its masks have SFT-P's shape).",
        "",
    ]
    head = (
        "| model | models | params (M) | params / dense | prefill tokens | prefill speed-up | "
        "ceiling | generation speed-up | ceiling |"
    )
    for b in BUDGETS:
        block = [(f"{label}", tag_of(m, b)) for m, label in BASELINES.items() if m != "fedflap"]
        block += [(f"SFT-P {label}", tag_of("sftp", b, v)) for v, (label, _, _) in VARIANTS.items()]
        rows = [
            row
            for label, tag in block
            if tag in runs and (row := size_row(label, runs[tag])) is not None
        ]
        rows += [
            f"| {label} | *not run* |" for label, tag in block if tag in tags and tag not in runs
        ]
        if rows:
            lines += [f"### {budget_label(b)}", "", head, "|---|" + "---|" * 8, *rows, ""]
    return lines
