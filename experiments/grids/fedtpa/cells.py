"""The FedTPA grid's cells: α × {FedIT, FlexLoRA, FedTPA} and FedTPA's ablations, each run once
whatever groups read it."""

from __future__ import annotations

import math
from typing import Any

from experiments.grids import Cell, plan, selected_groups

PRESETS = {
    "fedit": "conf/fedit-instructions.toml",
    "flexlora": "conf/flexlora.toml",
    "fedtpa": "conf/fedtpa.toml",
}
LABELS = {"fedit": "FedIT", "flexlora": "FlexLoRA", "fedtpa": "FedTPA"}
VARIANTS = {
    "": "",
    "fedavg": "fedtpa-lcwa=false",
    "no-itpa": "fedtpa-itpa=false",
    "no-dapr": "fedtpa-dapr=false",
}
ABLATIONS = (
    ("", "ITPA + DAPR + LCWA (full)"),
    ("no-itpa", "DAPR + LCWA (−ITPA)"),
    ("no-dapr", "ITPA + LCWA (−DAPR)"),
    ("fedavg", "ITPA + DAPR (−LCWA, FedAvg)"),
)
GROUPS = ("table2", "table3", "table4", "comm")
CLIENTS = 5
TABLE4_ALPHA = 0.5
NON_IID = (0.5, 1.0)


def alpha_name(alpha: float) -> str:
    return "inf" if math.isinf(alpha) else f"{alpha:g}"


def tag_of(method: str, alpha: float, variant: str = "") -> str:
    return f"a{alpha_name(alpha)}-{method}" + (f"-{variant}" if variant else "")


def overrides(alpha: float, variant: str) -> str:
    part = (
        'partitioner="iid"'
        if math.isinf(alpha)
        else f'partitioner="dirichlet" dirichlet-alpha={alpha}'
    )
    return " ".join(x for x in (part, f"min-nodes={CLIENTS}", VARIANTS[variant]) if x)


def cells(args: Any) -> list[Cell]:
    """The cells the selected groups need (`--only`, `--alphas`); a cell several groups read is run
    once."""
    alphas = [float(a) for a in str(getattr(args, "alphas", "0.5,1,inf")).split(",") if a.strip()]
    only = selected_groups(args, GROUPS, "FedTPA")
    needs = [(g, (m, a, "")) for a in alphas for m in PRESETS for g in ("table2", "comm")]
    needs += [("table3", ("fedtpa", a, v)) for a in alphas for v in ("", "fedavg")]
    needs += [("table4", ("fedtpa", TABLE4_ALPHA, v)) for v, _ in ABLATIONS]
    return [
        Cell(
            groups[0],
            tag_of(m, a, v),
            (PRESETS[m], overrides(a, v)),
            CLIENTS,
            {"method": m, "alpha": a, "variant": v, "groups": groups},
        )
        for (m, a, v), groups in plan(only, GROUPS, needs).items()
    ]
