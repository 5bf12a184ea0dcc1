"""The SFT-P cells' training recipes as their runs recorded them (config.json), and the run-config
keys on which cells of one budget differ besides their variant (conditioning, adapters). A
comparison between two such cells (+C vs NOC, +A vs NOA, the mixed run vs the uniform ones) measures
the variant and that difference together: the section says so instead of letting a partly re-run
grid (e.g. the 50% cells with and without the budget warm-up) pass for one experiment."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from experiments.grids import Cell, read_config
from experiments.grids.sftp.cells import budget_label
from fedprune_app.core.config import defaults

# the recipe columns of the section (label, keys)
RECIPE = (
    ("rounds × steps", ("num-server-rounds", "local-steps")),
    ("λ", ("sftp-lambda",)),
    ("τ", ("sftp-gate-tau",)),
    ("generator lr", ("sftp-generator-lr",)),
    ("LoRA lr", ("sftp-lora-lr",)),
    ("budget warm-up (steps)", ("sftp-budget-warmup-steps",)),
    ("loss on", ("sftp-loss-on",)),
    ("packed rows", ("pack-sequences",)),
)
# what a cell sets on purpose (its variant and budget) or what names the run; any other key that
# differs confounds
VARIANT_KEYS = frozenset(
    {"sftp-conditioning", "sftp-adapters", "keep-ratios", "run-tag", "output-dir"}
)
# what a run recorded before a key existed did, where that is not the key's default: rows were
# padded until packed rows (`pack-sequences`, default true) arrived
BEFORE_KEY = {"pack-sequences": False}


def resolved(config: Mapping[str, Any]) -> dict[str, Any]:
    """A recorded config with every key the app knows today: a key added after the run ran reads as
    what the run did, its default (a new key's default keeps the old behaviour) or, where not,
    BEFORE_KEY's value."""
    return defaults() | BEFORE_KEY | dict(config)


def differing_keys(configs: Sequence[Mapping[str, Any]]) -> list[str]:
    """The keys, besides VARIANT_KEYS, on which the resolved configs do not all agree (sorted)."""
    full = [resolved(c) for c in configs]
    keys = set().union(*full) - VARIANT_KEYS
    return sorted(k for k in keys if len({repr(c.get(k)) for c in full}) > 1)


def confounds(runs: Mapping[str, Path], tag: str, other: str) -> str:
    """' Confounded: …' when the recorded configs of two finished cells differ besides their
    variant, else '' (also while either has no config.json to tell)."""
    if not all(t in runs and (runs[t] / "config.json").is_file() for t in (tag, other)):
        return ""
    full = [resolved(read_config(runs[t])) for t in (tag, other)]
    if not (differ := differing_keys(full)):
        return ""
    return (
        f" Confounded: `{tag}` and `{other}` also differ in "
        + ", ".join(f"`{k}` ({full[0].get(k)} vs {full[1].get(k)})" for k in differ)
        + "."
    )


def _recipe_cells(config: Mapping[str, Any]) -> list[str]:
    full = resolved(config)
    return [" × ".join(f"{full.get(k)}" for k in keys) for _, keys in RECIPE]


def schedules(grid_cells: Sequence[Cell], runs: Mapping[str, Path]) -> list[str]:
    """'## SFT-P schedules': per budget, each distinct recipe of its SFT-P cells (from their
    config.json) with the cells that ran it; under a budget whose cells differ besides their
    variant, the keys that differ."""
    budgets: dict[Any, list[Cell]] = {}
    for cell in grid_cells:
        if cell.settings.get("method") == "sftp" and cell.tag in runs:
            budgets.setdefault(cell.settings["budget"], []).append(cell)
    if not budgets:
        return []
    lines = [
        "## SFT-P schedules",
        "",
        "Each SFT-P cell's training recipe as its run recorded it (config.json; a key the run "
        "predates reads as what the run did: its default, or padded rows before `pack-sequences`).",
        "",
        "| budget | cells | " + " | ".join(label for label, _ in RECIPE) + " |",
        "|---|---|" + "---|" * len(RECIPE),
    ]
    notes = []
    for budget, cells in budgets.items():
        configs = {c.tag: read_config(runs[c.tag]) for c in cells}
        recipes: dict[tuple[str, ...], list[str]] = {}
        for tag, config in configs.items():
            recipes.setdefault(tuple(_recipe_cells(config)), []).append(tag)
        for recipe, tags in recipes.items():
            lines.append(
                f"| {budget_label(budget)} | "
                + ", ".join(f"`{t}`" for t in tags)
                + " | "
                + " | ".join(recipe)
                + " |"
            )
        if differ := differing_keys(list(configs.values())):
            notes.append(
                f"- **Confounded, {budget_label(budget)}**: its SFT-P cells differ in "
                + ", ".join(f"`{k}`" for k in differ)
                + " besides their variant; a comparison between "
                "them measures that difference too."
            )
    return lines + (["", *notes] if notes else [])
