"""Experiment grids: run a method's presets over the settings of the paper's tables, then render the
tables with each claim marked held / not held, from the runs' own files (summary.json,
metrics.jsonl, artefacts).

    fedprune grid fedspallm                    # run what is missing, write <out>/tables.md
    fedprune grid fedspallm --only table1,comm # a subset of the cells
    fedprune grid fedspallm --render-only      # re-render from the finished runs
    fedprune grid fedspallm --render-only --out docs/runs/fedspallm  # ... from the archived records

A grid is a list of `Cell`s (presets + overrides + the number of SuperNodes) and a `render`
function. Cells whose run directory already holds a completed summary.json are not run again, so an
interrupted grid resumes.

Each grid is a package `grids/<m>/`: `cells.py` (the cells of the paper's tables), `records.py`
(what is read from the runs' files), `tables.py` (the Markdown tables and claims) and, where the
paper has figures, `figures.py`; tables and figures each read the records and neither imports the
other; `__init__.py` puts them together as `GRID`. This module holds what every grid shares: cells,
running and collecting them, archiving, reading run files, judging claims.
Every finished run's small records (`ARCHIVED`: config, summary, metrics, sparsity report,
results.md) are copied to `docs/runs/<grid>/<run>/` (`--archive`), so the tables can be re-rendered,
checked and resumed from a clone without the runs' model files.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from fedprune_app.core.progress import Clock, Countdown, duration
from fedprune_cli.runfiles import read_config as read_config
from fedprune_cli.runfiles import read_metrics as read_metrics
from fedprune_cli.runfiles import read_summary as read_summary
from fedprune_cli.runfiles import train_rows as train_rows
from fedprune_cli.verdicts import UNRESOLVED as UNRESOLVED
from fedprune_cli.verdicts import Interval as Interval
from fedprune_cli.verdicts import Pair as Pair
from fedprune_cli.verdicts import Verdict as Verdict
from fedprune_cli.verdicts import decide as decide
from fedprune_cli.verdicts import judge as judge
from fedprune_cli.verdicts import mark as mark


@dataclass(frozen=True)
class Cell:
    """One run of a grid: `group` (e.g. 'table1'), a tag unique in the grid, run configs,
    SuperNodes."""

    group: str
    tag: str
    run_config: tuple[str, ...]
    supernodes: int
    settings: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)


@dataclass(frozen=True)
class Grid:
    name: str
    method: str
    cells: Callable[[Any], list[Cell]]  # argparse namespace -> cells
    render: Callable[[list[Cell], dict[str, Path]], str]  # cells, {tag: run dir} -> Markdown


@dataclass(frozen=True)
class FigureGrid(Grid):
    """A grid that also draws figures next to tables.md: figures(cells, runs, out_dir) -> Markdown
    section."""

    figures: Callable[[list[Cell], dict[str, Path], Path], str] | None = None


def finished_run(out_dir: Path, method: str, tag: str) -> Path | None:
    """The newest run directory of `tag` under out_dir whose summary.json says completed."""
    for path in sorted(out_dir.glob(f"*-{method}-{tag}*"), reverse=True):
        summary = path / "summary.json"
        if (
            path.name.split(f"-{method}-", 1)[1] in (tag, *(f"{tag}-{i}" for i in range(2, 10)))
            and summary.is_file()
            and json.loads(summary.read_text()).get("status") == "completed"
        ):
            return path
    return None


def cell_method(grid: Grid, cell: Cell) -> str:
    """The method a cell runs: the grid's, or the cell's own (settings `method`, e.g. FedTPA's
    baselines); its run directory is named after it."""
    return str(cell.settings.get("method", grid.method))


def run_cells(
    grid: Grid,
    cells: Sequence[Cell],
    out_dir: Path,
    quiet: bool = False,
    clock: Clock = time.monotonic,
    timeout: float = 7200,
) -> dict[str, Path]:
    """Launch every cell that has no completed run yet (one `flwr run` each); return {tag: run dir}.
    Prints `cell i/N` before and after each launch, with the time elapsed and the time left: the
    mean time of the cells launched so far times the cells still to launch (finished cells are
    skipped and cost nothing). A cell still running after `timeout` seconds is stopped (`launch`)
    and left out, and the grid goes on to the next cell."""
    from fedprune_cli.launch import launch

    runs: dict[str, Path] = {}
    todo = sum(finished_run(out_dir, cell_method(grid, c), c.tag) is None for c in cells)
    countdown = Countdown(todo, clock)
    for i, cell in enumerate(cells, 1):
        head = f"[grid] {grid.name} cell {i}/{len(cells)}"
        done = finished_run(out_dir, cell_method(grid, cell), cell.tag)
        if done is None:
            print(
                f"{head}: {cell.tag} ({cell.supernodes} clients); {countdown.status()}", flush=True
            )
            start = clock()
            try:
                launched = launch(
                    [*cell.run_config, f'run-tag="{cell.tag}" output-dir="{out_dir}"'],
                    f"num-supernodes={cell.supernodes} client-resources-num-cpus=1",
                    quiet=quiet,
                    timeout=timeout,
                )
                done = launched.run_dir if launched.code == 0 else None
                outcome = (
                    "done"
                    if done is not None
                    else f"failed (status {launched.status}), left out of the tables"
                )
            except subprocess.TimeoutExpired:
                done, outcome = (
                    None,
                    f"stopped after --timeout {timeout:.0f} s, left out of the tables",
                )
            countdown.done(clock() - start)
            print(
                f"{head}: {cell.tag} {outcome} in {duration(countdown.took[-1])}; "
                f"{countdown.status()} ({countdown.left_units} of {todo} cells to run)",
                flush=True,
            )
        else:
            print(f"{head}: {cell.tag} already done ({done.name})", flush=True)
        if done is not None:
            runs[cell.tag] = done
    return runs


def collect_runs(grid: Grid, cells: Sequence[Cell], out_dir: Path) -> dict[str, Path]:
    return {
        c.tag: run
        for c in cells
        if (run := finished_run(out_dir, cell_method(grid, c), c.tag)) is not None
    }


def selected_groups(args: Any, groups: Sequence[str], grid_name: str) -> list[str]:
    """The groups `--only` names (all when empty); SystemExit naming the grid's groups for an
    unknown one."""
    only = [g for g in str(getattr(args, "only", "")).split(",") if g] or list(groups)
    unknown = sorted(set(only) - set(groups))
    if unknown:
        raise SystemExit(
            f"--only: unknown group(s) {unknown}; {grid_name}'s are {', '.join(groups)}"
        )
    return only


def seeds_of(args: Any) -> list[int]:
    """`--seeds`: the seeds each replicated cell runs with; 0 (the tables' own run) must be among
    them."""
    seeds = [int(s) for s in str(getattr(args, "seeds", "0") or "0").split(",")]
    if 0 not in seeds:
        raise SystemExit(f"--seeds must include 0 (the tables' own run), got {seeds}")
    return seeds


def replicate(cell: Cell, seed: int) -> Cell:
    """`cell` run again with `seed=<seed>` appended to its last run config: tag `<tag>-seed<seed>`,
    its settings marking the cell it replicates. Seed 0 is the cell itself (the tables show it; the
    claims pool them all)."""
    if seed == 0:
        return cell
    return Cell(
        cell.group,
        f"{cell.tag}-seed{seed}",
        (*cell.run_config[:-1], f"{cell.run_config[-1]} seed={seed}"),
        cell.supernodes,
        {**cell.settings, "replicate-of": cell.tag, "seed": seed},
    )


def replicate_tags(tags: Iterable[str], tag: str) -> dict[int, str]:
    """{seed: tag} of the cell `tag` and its replicates (`replicate`'s tags) among `tags` (e.g. the
    finished runs), by seed; {} without the cell itself (seed 0): replicates are pooled with it,
    never read alone."""
    tags = set(tags)
    if tag not in tags:
        return {}
    prefix = f"{tag}-seed"
    found = {
        int(t.removeprefix(prefix)): t
        for t in tags
        if t.startswith(prefix) and t.removeprefix(prefix).isdigit()
    }
    return {0: tag, **dict(sorted(found.items()))}


ARCHIVED = (
    "config.json",
    "summary.json",
    "metrics.jsonl",
    "sparsity.json",
    "results.md",
    "masks.json",
    "masks.npz",
    "rescore.json",
)


def plan(
    only: Sequence[str], groups: Sequence[str], needs: Iterable[tuple[str, tuple[Any, ...]]]
) -> dict[tuple[Any, ...], tuple[str, ...]]:
    """{cell key: the selected groups that read it, in `groups` order}, keys in first-needed order:
    a cell that several groups read is planned (and run) once. `needs`: (group, cell key) pairs."""
    wanted: dict[tuple[Any, ...], set[str]] = {}
    for group, key in needs:
        if group in only:
            wanted.setdefault(key, set()).add(group)
    return {key: tuple(sorted(g, key=list(groups).index)) for key, g in wanted.items()}


ARCHIVE_MAX_BYTES = (
    1 << 20
)  # FedSpaLLM's masks.npz (~15 MB) stays with the run; SFT-P's (~50 kB) is archived


def archive_runs(runs: dict[str, Path], dest: Path) -> list[Path]:
    """Copy each run's `ARCHIVED` files of at most `ARCHIVE_MAX_BYTES` to dest/<run directory name>/
    (what the tables are rendered from); returns the archived directories. A run already under dest
    is left as it is."""
    out = []
    for run in runs.values():
        target = dest / run.name
        if run.resolve() != target.resolve():
            target.mkdir(parents=True, exist_ok=True)
            for name in ARCHIVED:
                if (run / name).is_file() and (run / name).stat().st_size <= ARCHIVE_MAX_BYTES:
                    shutil.copy2(run / name, target / name)
        out.append(target)
    return out


def runs_section(grid_cells: Sequence[Cell], runs: dict[str, Path]) -> list[str]:
    """'## Runs': each cell's run directory, linked relative to tables.md (a grid's runs sit next to
    it, in outputs/grids/<grid> and in the committed docs/runs/<grid> alike)."""
    return [
        "## Runs",
        "",
        *(
            f"- `{c.tag}`: [`{runs[c.tag].name}`]({runs[c.tag].name}/)"
            if c.tag in runs
            else f"- `{c.tag}`: not run"
            for c in grid_cells
        ),
    ]


@lru_cache(maxsize=8)
def model_parameters(model_name: str) -> int | None:
    """N: parameters of the run's base model (tied weights once), counted on the meta device from
    its config (no weights loaded); None when the model cannot be resolved here."""
    try:
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM

        from fedprune_app.llm.models import resolve_model_path

        config = AutoConfig.from_pretrained(resolve_model_path(model_name))
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
        return sum(p.numel() for p in model.parameters())
    except Exception:  # noqa: BLE001 - a missing model leaves the column empty, never the table
        return None


def fmt_ppl(value: float | None) -> str:
    if value is None:
        return "–"
    return f"{value:.2e}" if value >= 1e4 else f"{value:.2f}"
