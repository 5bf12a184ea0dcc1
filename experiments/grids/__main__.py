"""`fedprune grid <grid> [--only groups] [--sparsity ...] [--seeds ...] [--alphas ...] [--tags ...]
[--run-config 'k=v ...'] [--out DIR] [--render-only] [--quiet]`."""

from __future__ import annotations

import argparse
import signal
import sys
from dataclasses import replace
from pathlib import Path

from experiments.grids import Cell, Grid, archive_runs, collect_runs, run_cells
from experiments.grids.fedspallm import GRID as FEDSPALLM
from experiments.grids.fedtpa import GRID as FEDTPA
from experiments.grids.sftp import GRID as SFTP

GRIDS = {g.name: g for g in (FEDSPALLM, FEDTPA, SFTP)}


def select(cells: list[Cell], tags: str, extra: str) -> list[Cell]:
    """The cells named in `tags` (all when empty), each with the `extra` overrides appended (later
    wins)."""
    wanted = [t for t in tags.split(",") if t]
    unknown = sorted(set(wanted) - {c.tag for c in cells})
    if unknown:
        raise SystemExit(
            f"--tags: no cell {unknown}; the grid's cells: {', '.join(c.tag for c in cells)}"
        )
    chosen = [c for c in cells if not wanted or c.tag in wanted]
    return [replace(c, run_config=(*c.run_config, extra)) if extra.strip() else c for c in chosen]


def runs_of(
    grid: Grid,
    cells: list[Cell],
    out_dir: Path,
    render_only: bool,
    quiet: bool,
    timeout: float = 7200,
) -> dict[str, Path]:
    """Run (or only collect) the cells, with `cell i/N`, time elapsed and time left printed around
    each launch; a cell of another method (settings `method`, e.g. FedTPA's baselines) is run and
    found under that method's run-directory name (`cell_method`)."""
    return (
        collect_runs(grid, cells, out_dir)
        if render_only
        else run_cells(grid, cells, out_dir, quiet, timeout=timeout)
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "grid", choices=sorted(GRIDS), help="the paper whose tables to run or render"
    )
    parser.add_argument(
        "--only",
        default="",
        help="comma-separated cell groups (e.g. table1,comm; SFT-P: "
        "table1,table2,figs,comm); default all",
    )
    parser.add_argument(
        "--sparsity", default="0.5,0.6,0.7,0.8", help="FedSpaLLM: target sparsities"
    )
    parser.add_argument(
        "--seeds",
        default="0",
        help="FedSpaLLM: seeds of each table cell; SFT-P: of each variant "
        "cell (the ablations); seed 0 is the tables' run, the others replicates that the claims "
        "pool (e.g. 0,1,2)",
    )
    parser.add_argument(
        "--alphas", default="0.5,1,inf", help="FedTPA: Dirichlet alphas (inf = IID)"
    )
    parser.add_argument(
        "--tags", default="", help="comma-separated cell tags to run; default every selected cell"
    )
    parser.add_argument(
        "--run-config",
        default="",
        help="'key=value ...' overrides appended to every cell "
        "(e.g. another model or client-data); mind that finished cells are not rerun",
    )
    parser.add_argument(
        "--out", default="", help="where the runs and tables.md go (default outputs/grids/<grid>)"
    )
    parser.add_argument(
        "--archive",
        default="",
        help="where the finished runs' small records are copied "
        "(default docs/runs/<grid>; 'none' = do not copy)",
    )
    parser.add_argument(
        "--render-only", action="store_true", help="do not run; render from finished runs"
    )
    parser.add_argument("--quiet", action="store_true", help="hide each run's log stream")
    parser.add_argument(
        "--timeout",
        type=float,
        default=7200,
        help="seconds one cell may run before it is stopped "
        "and left out (default 7200; a cell beside other heavy work on 2 cores can need more)",
    )
    args = parser.parse_args(argv)
    signal.signal(
        signal.SIGTERM, lambda *_: sys.exit(143)
    )  # lets the running launch stop its SuperLink
    grid = GRIDS[args.grid]
    out_dir = Path(args.out or f"outputs/grids/{grid.name}").resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    cells = select(grid.cells(args), args.tags, args.run_config)
    runs = runs_of(grid, cells, out_dir, args.render_only, args.quiet, args.timeout)
    text = grid.render(cells, runs)
    figures = getattr(grid, "figures", None)
    if figures is not None:
        text += "\n" + figures(cells, runs, out_dir)
    (out_dir / "tables.md").write_text(text)
    print(text)
    print(f"[grid] written {out_dir / 'tables.md'}")
    if args.archive != "none":
        archive = Path(args.archive or f"docs/runs/{grid.name}")
        archive_runs(runs, archive)
        print(f"[grid] the runs' records archived under {archive}")
    return 0 if len(runs) == len(cells) else 1


if __name__ == "__main__":
    sys.exit(main())
