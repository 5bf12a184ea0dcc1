"""FedSpaLLM's Tables 1–3 (4, 8, 16 clients × 50–80% sparsity) and its communication figures, on
this app.

Each table cell is one run of `conf/fedspallm-table{1,2,3}.toml` (every client prunes every layer,
one round, as in the paper's tables) with `sparsity` set; the run itself scores dense, random,
standalone (mean of the clients), FedSpaLLM and centralized on the same held-out texts. The
communication cell reruns Table 1's 50% setting with layer sampling (`conf/fedspallm.toml`,
r_i = 0.5).

cells.py: the cells; records.py: what is read from the runs' files; tables.py: the tables, claims
and communication.
"""

from __future__ import annotations

from experiments.grids import Grid
from experiments.grids.fedspallm.cells import cells
from experiments.grids.fedspallm.tables import render

GRID = Grid("fedspallm", "fedspallm", cells, render)
