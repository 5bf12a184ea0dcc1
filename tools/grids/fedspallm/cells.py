"""The FedSpaLLM grid's cells: Tables 1–3 (4, 8, 16 clients) × the target sparsities, and the communication cell."""

from __future__ import annotations

from typing import Any

from tools.grids import Cell

TABLES = {"table1": 4, "table2": 8, "table3": 16}


def cells(args: Any) -> list[Cell]:
    sparsities = [float(s) for s in str(args.sparsity).split(",")]
    out = []
    for group, n in TABLES.items():
        for s in sparsities:
            out.append(Cell(group, f"{group}-s{round(s * 100)}", (f"conf/fedspallm-{group}.toml", f"sparsity={s}"),
                            n, {"clients": n, "sparsity": s}))
    out.append(Cell("comm", "comm-sampled", ("conf/fedspallm.toml", "sparsity=0.5 fedspallm-references=''"), 4,
                    {"clients": 4, "sparsity": 0.5, "resources": 0.5}))
    only = [g for g in str(args.only).split(",") if g]
    return [c for c in out if not only or c.group in only]
