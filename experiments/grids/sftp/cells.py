"""The SFT-P grid's cells: presets × budgets × variants, each run once whatever groups read it.

Each budget runs on its own SFT-P schedule (`SFTP_PRESETS`: keep 0.8 = `conf/sftp.toml`, 6 × 25
steps; keep 0.5 = `conf/sftp-50.toml` and the mixed budgets = `conf/sftp-mixed.toml`, 12 × 50 steps,
the latter without the budget warm-up), and every baseline (fedflap, LLM-Pruner (FL),
SliceGPT (FL)) gets the same recovery: one statistics round, then as many rounds × local steps of
LoRA as SFT-P trains, at SFT-P's LoRA learning rate (`baseline_schedule`). So every row of Table 1
has seen the same data and steps.
"""

from __future__ import annotations

import tomllib
from functools import lru_cache
from pathlib import Path
from typing import Any

from experiments.grids import Cell, plan, replicate, seeds_of, selected_groups

PRESETS = {
    "fedflap": "conf/fedflap.toml",
    "llmpruner": "conf/llmpruner.toml",
    "slicegpt": "conf/slicegpt.toml",
}
SFTP_PRESETS = {0.8: "conf/sftp.toml", 0.5: "conf/sftp-50.toml", "mixed": "conf/sftp-mixed.toml"}
BASELINES = {
    "fedflap": "fedflap",
    "llmpruner": "LLM-Pruner (FL)",
    "slicegpt": "SliceGPT (FL)",
}  # method: label
KEEP_KEYS = {
    "fedflap": "keep-ratios",
    "llmpruner": "llmpruner-keep-ratio",
    "slicegpt": "slicegpt-keep-ratio",
}
VARIANTS = {
    "noc-noa": ("NOC/NOA", False, False),
    "noc-a": ("NOC/+A", False, True),
    "c-noa": ("+C/NOA", True, False),
    "c-a": ("+C/+A", True, True),
}  # label, conditioning, adapters
BUDGETS = (0.8, 0.5)  # keep ratios: 20% and 50% structural pruning
MIXED = "0.8,0.8,0.5,0.5"  # Table 2: 20% on clients 0-1, 50% on clients 2-3
GROUPS = ("table1", "table2", "figs", "comm")
CLIENTS = 4
BUDGET_TOLERANCE = (
    0.02  # absolute, on the kept ratio of the prunable projections (Fig. 4b's ±2% band)
)
APP_DIR = Path(__file__).resolve().parents[3]
Budget = float | str  # a keep ratio, or "mixed"


def budget_name(budget: Budget) -> str:
    return "mixed" if budget == "mixed" else f"p{round(float(budget) * 100)}"


def budget_label(budget: Budget) -> str:
    return (
        "mixed"
        if budget == "mixed"
        else f"{round((1 - float(budget)) * 100)}% pruned (keep {float(budget):g})"
    )


def tag_of(method: str, budget: Budget, variant: str = "") -> str:
    return f"{budget_name(budget)}-{variant if method == 'sftp' else method}"


@lru_cache(maxsize=4)
def sftp_schedule(budget: Budget) -> tuple[int, int, float]:
    """(rounds, local steps, LoRA lr) of the SFT-P preset of a budget, read from the preset file."""
    preset = tomllib.loads((APP_DIR / SFTP_PRESETS[budget]).read_text())
    return (
        int(preset["num-server-rounds"]),
        int(preset["local-steps"]),
        float(preset["sftp-lora-lr"]),
    )


def baseline_schedule(budget: Budget) -> str:
    """A baseline's overrides for SFT-P's schedule at this budget: round 1 collects statistics,
    rounds 2..R+1 train LoRA for SFT-P's R × E steps at SFT-P's LoRA learning rate."""
    rounds, steps, lr = sftp_schedule(budget)
    return f"num-server-rounds={rounds + 1} local-steps={steps} learning-rate={lr:g}"


def overrides(method: str, budget: Budget, variant: str) -> str:
    """The cell's run-config overrides. Every cell trains on padded rows (`pack-sequences=false`):
    the grid's first cells ran before packed training existed, and a grid compares its cells on one
    code path (packed rows give the same loss and gradients to float rounding,
    tests/llm/test_training.py, but not bit for bit), and in float32 (`mixed-precision='no'`,
    whatever the preset says), as every archived cell did.

    Every SFT-P cell deploys the averaged (Θ, Φ) (`sftp-deploy-state="global"`) whatever its preset
    says: under "local" each client deploys the Θ_k of its own last local steps, so NOC clients
    would get personal masks too and +C vs NOC would no longer compare one shared mask against
    e_k-conditioned ones (the paper's ablation); it is also the rule every archived cell ran with. A
    `--run-config` extra still overrides it (later wins)."""
    ratios = MIXED if budget == "mixed" else f"{float(budget):g}"
    parts = [f"min-nodes={CLIENTS}", "pack-sequences=false", "mixed-precision='no'"]
    if method == "sftp":
        _, conditioning, adapters = VARIANTS[variant]
        parts += [
            f'keep-ratios="{ratios}"',
            f"sftp-conditioning={str(conditioning).lower()}",
            f"sftp-adapters={str(adapters).lower()}",
            'sftp-deploy-state="global"',
        ]
    else:
        value = f'"{ratios}"' if method == "fedflap" else ratios
        parts += [f"{KEEP_KEYS[method]}={value}", baseline_schedule(budget)]
    return " ".join(parts)


def preset_of(method: str, budget: Budget) -> str:
    return SFTP_PRESETS[budget] if method == "sftp" else PRESETS[method]


def cells(args: Any) -> list[Cell]:
    """The cells the selected groups (`--only`) need, a cell several groups read run once; then the
    SFT-P variants' seed replicates (`--seeds`, tags `<cell>-seed<k>`)."""
    only = selected_groups(args, GROUPS, "SFT-P")
    needs = [
        n
        for b in BUDGETS
        for n in [
            *(("table1", ("sftp", b, v)) for v in VARIANTS),
            *(("table1", (m, b, "")) for m in BASELINES),
        ]
    ]
    needs += [
        (g, ("sftp", b, "c-a")) for b in (*BUDGETS, "mixed") for g in ("table2", "figs")
    ]  # figs: 4b every
    needs += [("comm", ("sftp", 0.5, v)) for v in VARIANTS] + [
        ("comm", ("fedflap", 0.5, ""))
    ]  # +C/+A; 3, 5: 50%
    planned = [
        Cell(
            groups[0],
            tag_of(m, b, v),
            (preset_of(m, b), overrides(m, b, v)),
            CLIENTS,
            {"method": m, "budget": b, "variant": v, "groups": groups},
        )
        for (m, b, v), groups in plan(only, GROUPS, needs).items()
    ]
    return planned + [
        replicate(c, seed) for seed in seeds_of(args) if seed for c in planned if replicated(c)
    ]


def replicated(cell: Cell) -> bool:
    """`--seeds` replicates the four SFT-P variants at the uniform budgets: the cells of the paper's
    ablations (+C vs NOC, +A vs NOA), whose paired answer perplexities then pool the training noise
    of several runs (rescored.perplexity_comparisons). The baselines and the mixed run stay single
    runs."""
    return cell.settings["method"] == "sftp" and cell.settings["budget"] in BUDGETS
