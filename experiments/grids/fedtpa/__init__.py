"""FedTPA's Tables II–IV, its claims and the communication per client and round, on this app.

Every cell is one run of `conf/fedtpa.toml`, `conf/flexlora.toml` or `conf/fedit-instructions.toml`
(the presets differ only in their method keys) with 5 SuperNodes and the partition set: α = 0.5 or 1
(Dirichlet over the task categories) or inf (`partitioner = "iid"`). Table II: α × {FedIT, FlexLoRA,
FedTPA}. Table III: LCWA (the Table II FedTPA cell, not run twice) vs FedAvg (`fedtpa-lcwa = false`)
at each α. Table IV at α = 0.5: full, −ITPA, −DAPR, −LCWA (the Table III FedAvg cell).
Communication: the `bytes-up` / `bytes-down` of the Table II cells' accepted train rows (no extra
runs). Rouge-L: the run's federated evaluation of the global adapter on the global test split in its
last round (metrics.jsonl `evaluate` rows), ×100 as in the paper.

cells.py: the cells; records.py: what is read from the runs' files; tables.py: Tables II–IV, the
claims and the communication; figures.py: Figs. 4–5.
"""

from __future__ import annotations

from experiments.grids import FigureGrid
from experiments.grids.fedtpa.cells import cells
from experiments.grids.fedtpa.figures import figures
from experiments.grids.fedtpa.tables import render

GRID = FigureGrid("fedtpa", "fedtpa", cells, render, figures)
