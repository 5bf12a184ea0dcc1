"""`python -m fedprune_app.grids <grid> [--only groups] [--sparsity ...] [--out DIR] [--render-only] [--quiet]`."""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from fedprune_app.grids import collect_runs, run_cells
from fedprune_app.grids.fedspallm import GRID as FEDSPALLM

GRIDS = {g.name: g for g in (FEDSPALLM,)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("grid", choices=sorted(GRIDS))
    parser.add_argument("--only", default="", help="comma-separated cell groups (e.g. table1,comm); default all")
    parser.add_argument("--sparsity", default="0.5,0.6,0.7,0.8", help="FedSpaLLM: target sparsities")
    parser.add_argument("--out", default="", help="where the runs and tables.md go (default outputs/grids/<grid>)")
    parser.add_argument("--render-only", action="store_true", help="do not run; render from finished runs")
    parser.add_argument("--quiet", action="store_true", help="hide each run's log stream")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # lets the running launch stop its SuperLink
    grid = GRIDS[args.grid]
    out_dir = Path(args.out or f"outputs/grids/{grid.name}").resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    cells = grid.cells(args)
    runs = collect_runs(grid, cells, out_dir) if args.render_only else run_cells(grid, cells, out_dir, args.quiet)
    text = grid.render(cells, runs)
    (out_dir / "tables.md").write_text(text)
    print(text)
    print(f"[grid] written {out_dir / 'tables.md'}")
    return 0 if len(runs) == len(cells) else 1


if __name__ == "__main__":
    sys.exit(main())
