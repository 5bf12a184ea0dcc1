"""The FedSpaLLM grid's cells: Tables 1–3 (4, 8, 16 clients) × the target sparsities under this
app's protocol, the same sparsities under the paper's protocol (`paper`: 4 clients), and the
communication cell.

Protocols: `table1..3` calibrate each client on its own domain and score the four domains
(`conf/fedspallm-table*.toml`); `paper` calibrates every client on an IID share of one generic
corpus and scores corpora no client calibrated on (`conf/fedspallm-paper.toml`). `--seeds 0,1,2`
adds replicates of every table cell (tag `<cell>-seed<k>`, run config `seed=k`): the tables show
seed 0, the claims pool the replicates (experiments/grids/fedspallm/paired.py). A replicate leaves
out the random reference (`REPLICATE_REFERENCES`): no pooled claim reads it (random ≥ 100× is
decided on the tables' own runs), and it costs a replicate ~6 of its ~55 minutes here."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from experiments.grids import Cell, replicate, seeds_of

TABLES = {"table1": 4, "table2": 8, "table3": 16, "paper": 4}  # group: clients
PRESETS = {
    "table1": "conf/fedspallm-table1.toml",
    "table2": "conf/fedspallm-table2.toml",
    "table3": "conf/fedspallm-table3.toml",
    "paper": "conf/fedspallm-paper.toml",
}
REPLICATE_REFERENCES = "fedspallm-references='standalone,centralized'"


def lean_replicate(cell: Cell, seed: int) -> Cell:
    """`replicate(cell, seed)` without the random reference (seed 0: the cell itself, every
    reference)."""
    rep = replicate(cell, seed)
    if seed == 0:
        return rep
    return replace(
        rep, run_config=(*rep.run_config[:-1], f"{rep.run_config[-1]} {REPLICATE_REFERENCES}")
    )


def cells(args: Any) -> list[Cell]:
    sparsities = [float(s) for s in str(args.sparsity).split(",")]
    seeds = seeds_of(args)
    out = []
    for group, n in TABLES.items():
        for s in sparsities:
            tag = f"{group}-s{round(s * 100)}"
            cell = Cell(
                group, tag, (PRESETS[group], f"sparsity={s}"), n, {"clients": n, "sparsity": s}
            )
            out += [lean_replicate(cell, seed) for seed in seeds]
    out.append(
        Cell(
            "comm",
            "comm-sampled",
            ("conf/fedspallm.toml", "sparsity=0.5 fedspallm-references=''"),
            4,
            {"clients": 4, "sparsity": 0.5, "resources": 0.5},
        )
    )
    only = [g for g in str(args.only).split(",") if g]
    return [c for c in out if not only or c.group in only]
