"""The SFT-P grid's cells: presets × budgets × variants, each run once whatever groups read it."""

from __future__ import annotations

from typing import Any

from tools.grids import Cell, plan, selected_groups

PRESETS = {"sftp": "conf/sftp.toml", "fedflap": "conf/fedflap.toml"}
VARIANTS = {"noc-noa": ("NOC/NOA", False, False), "noc-a": ("NOC/+A", False, True),
            "c-noa": ("+C/NOA", True, False), "c-a": ("+C/+A", True, True)}  # label, conditioning, adapters
BUDGETS = (0.8, 0.5)  # keep ratios: 20% and 50% structural pruning
MIXED = "0.8,0.8,0.5,0.5"  # Table 2: 20% on clients 0-1, 50% on clients 2-3
GROUPS = ("table1", "table2", "figs", "comm")
CLIENTS = 4
BUDGET_TOLERANCE = 0.02  # absolute, on the kept ratio of the prunable projections (Fig. 4b's ±2% band)
Budget = float | str  # a keep ratio, or "mixed"


def budget_name(budget: Budget) -> str:
    return "mixed" if budget == "mixed" else f"p{round(float(budget) * 100)}"


def budget_label(budget: Budget) -> str:
    return "mixed" if budget == "mixed" else f"{round((1 - float(budget)) * 100)}% pruned (keep {float(budget):g})"


def tag_of(method: str, budget: Budget, variant: str = "") -> str:
    return f"{budget_name(budget)}-{variant if method == 'sftp' else 'fedflap'}"


def overrides(method: str, budget: Budget, variant: str) -> str:
    ratios = MIXED if budget == "mixed" else f"{float(budget):g}"
    parts = [f'sftp-keep-ratios="{ratios}"', f"min-nodes={CLIENTS}"]
    if method == "sftp":
        _, conditioning, adapters = VARIANTS[variant]
        parts += [f"sftp-conditioning={str(conditioning).lower()}", f"sftp-adapters={str(adapters).lower()}"]
    return " ".join(parts)


def cells(args: Any) -> list[Cell]:
    """The cells the selected groups (`--only`) need; a cell several groups read is run once."""
    only = selected_groups(args, GROUPS, "SFT-P")
    needs = [n for b in BUDGETS
             for n in [*(("table1", ("sftp", b, v)) for v in VARIANTS), ("table1", ("fedflap", b, ""))]]
    needs += [(g, ("sftp", b, "c-a")) for b in (*BUDGETS, "mixed") for g in ("table2", "figs")]  # figs: 4b every
    needs += [("comm", ("sftp", 0.5, v)) for v in VARIANTS] + [("comm", ("fedflap", 0.5, ""))]  # +C/+A; 3, 5: 50%
    return [Cell(groups[0], tag_of(m, b, v), (PRESETS[m], overrides(m, b, v)), CLIENTS,
                 {"method": m, "budget": b, "variant": v, "groups": groups})
            for (m, b, v), groups in plan(only, GROUPS, needs).items()]
