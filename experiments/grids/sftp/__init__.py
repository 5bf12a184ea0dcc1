"""SFT-P's Tables 1–2, its claims and the communication per client and round, on this app
(tables.py; the same on re-scored accuracies: rescored.py), and Figs. 3, 4b, 5 (figures.py).

Every cell is one run with 4 SuperNodes (`min-nodes = 4`: the round waits for all four clients, the
paper's q = 1) of a preset with overrides (cells.py): SFT-P NOC/NOA, NOC/+A, +C/NOA, +C/+A
(`sftp-conditioning`, `sftp-adapters`) at uniform keep ratios 0.8 ("20% pruning", `conf/sftp.toml`)
and 0.5 ("50%", `conf/sftp-50.toml`); the federated baselines fedflap, LLM-Pruner (FL) and SliceGPT
(FL) at both budgets with SFT-P's LoRA steps and rate (fedflap's run also gives the dense
model = round 0 and post hoc = round 1); +C/+A with mixed budgets "0.8,0.8,0.5,0.5" (Table 2).
Groups: table1, table2, figs, comm; a cell several groups read runs once.

Every number is read from the runs' own files: accuracy and kept ratio from the `evaluate` rows of
metrics.jsonl (per client = partition id, on its own test split, in the run's last round,
`num-server-rounds` of config.json); budgets from config.json's `keep-ratios`; the kept ratio
per round (Fig. 4b) and the bytes from the accepted `train` rows; the masks from
masks.json / masks.npz (figures).

cells.py: the cells; records.py: what is read from the runs' files; size.py: the deployed models'
size and speed; schedules.py: each SFT-P cell's recorded recipe and the comparisons it confounds.
"""

from __future__ import annotations

from pathlib import Path

from experiments.grids import Cell, FigureGrid, runs_section
from experiments.grids.sftp.cells import cells
from experiments.grids.sftp.figures import figures
from experiments.grids.sftp.records import answer_perplexity
from experiments.grids.sftp.rescored import section
from experiments.grids.sftp.schedules import schedules
from experiments.grids.sftp.size import size_and_speed
from experiments.grids.sftp.tables import claims, communication, table1, table2

PPL_NOTE = (
    "Answer perplexity (lower is better) of each client on its own test questions in the same "
    "evaluations as the accuracies above: the deployed model's quality with less noise than "
    "accuracy on 30 questions. avg: the mean over the four clients' perplexities."
)


def render(all_cells: list[Cell], runs: dict[str, Path]) -> str:
    """The tables from each cell's own run (seed 0); seed replicates (`--seeds`) enter only the
    paired ablations, pooled (rescored.perplexity_comparisons), the masks' agreement and the list of
    runs."""
    grid_cells = [c for c in all_cells if "replicate-of" not in c.settings]
    groups = {g for c in grid_cells for g in c.settings["groups"]}
    lines = [
        "# SFT-P on this app: the paper's Tables 1–2, claims and communication",
        "",
        "4 clients (one task each, non-IID), every run's numbers read from its metrics.jsonl and "
        "config.json. Budgets as in the paper: '20%' = keep ratio 0.8 of the prunable projections, "
        "'50%' = 0.5. Run directories at the end.",
        "",
    ]
    lines += [*schedule, ""] if (schedule := schedules(grid_cells, runs)) else []
    if "table1" in groups:
        lines += table1(grid_cells, runs)
        lines += table1(grid_cells, runs, answer_perplexity, " (answer perplexity)", PPL_NOTE)
        lines += size_and_speed(grid_cells, runs)
    if "table2" in groups:
        lines += table2(runs)
    lines += claims(grid_cells, runs)
    if "comm" in groups:
        lines += ["", *communication(grid_cells, runs)]
    rescored = section(grid_cells, runs)
    lines += ["", *rescored] if rescored else []
    lines += ["", *runs_section(all_cells, runs)]
    return "\n".join(lines) + "\n"


GRID = FigureGrid("sftp", "sftp", cells, render, figures)
