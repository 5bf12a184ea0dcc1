"""Experiment grids: run a method's presets over the settings of the paper's tables, then render the tables
with each claim marked held / not held, from the runs' own files (summary.json, metrics.jsonl, artefacts).

    python -m tools.grids fedspallm                    # run what is missing, write <out>/tables.md
    python -m tools.grids fedspallm --only table1,comm # a subset of the cells
    python -m tools.grids fedspallm --render-only      # re-render from the finished runs
    python -m tools.grids fedspallm --render-only --out docs/runs/fedspallm  # ... from the archived records

A grid is a list of `Cell`s (presets + overrides + the number of SuperNodes) and a `render` function. Cells whose
run directory already holds a completed summary.json are not run again, so an interrupted grid resumes.

Each grid is a package `tools/grids/<m>/`: `cells.py` (the cells of the paper's tables), `records.py` (what is read
from the runs' files), `tables.py` (the Markdown tables and claims) and, where the paper has figures, `figures.py`;
tables and figures each read the records and neither imports the other; `__init__.py` puts them together as `GRID`.
This module holds what every grid shares: cells, running and collecting them, archiving, reading run files,
judging claims.
Every finished run's small records (`ARCHIVED`: config, summary, metrics, sparsity report, results.md) are copied
to `docs/runs/<grid>/<run>/` (`--archive`), so the tables can be re-rendered, checked and resumed from a clone
without the runs' model files.
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


@dataclass(frozen=True)
class Cell:
    """One run of a grid: `group` (e.g. 'table1'), a tag unique in the grid, run configs, SuperNodes."""

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
    """A grid that also draws figures next to tables.md: figures(cells, runs, out_dir) -> Markdown section."""

    figures: Callable[[list[Cell], dict[str, Path], Path], str] | None = None


def finished_run(out_dir: Path, method: str, tag: str) -> Path | None:
    """The newest run directory of `tag` under out_dir whose summary.json says completed."""
    for path in sorted(out_dir.glob(f"*-{method}-{tag}*"), reverse=True):
        summary = path / "summary.json"
        if path.name.split(f"-{method}-", 1)[1] in (tag, *(f"{tag}-{i}" for i in range(2, 10))) \
                and summary.is_file() and json.loads(summary.read_text()).get("status") == "completed":
            return path
    return None


def cell_method(grid: Grid, cell: Cell) -> str:
    """The method a cell runs: the grid's, or the cell's own (settings `method`, e.g. FedTPA's baselines); its run
    directory is named after it."""
    return str(cell.settings.get("method", grid.method))


def run_cells(grid: Grid, cells: Sequence[Cell], out_dir: Path, quiet: bool = False,
              clock: Clock = time.monotonic, timeout: float = 7200) -> dict[str, Path]:
    """Launch every cell that has no completed run yet (one `flwr run` each); return {tag: run dir}. Prints
    `cell i/N` before and after each launch, with the time elapsed and the time left: the mean time of the cells
    launched so far times the cells still to launch (finished cells are skipped and cost nothing). A cell still
    running after `timeout` seconds is stopped (`launch`) and left out, and the grid goes on to the next cell."""
    from tools.launch import launch

    runs: dict[str, Path] = {}
    todo = sum(finished_run(out_dir, cell_method(grid, c), c.tag) is None for c in cells)
    countdown = Countdown(todo, clock)
    for i, cell in enumerate(cells, 1):
        head = f"[grid] {grid.name} cell {i}/{len(cells)}"
        done = finished_run(out_dir, cell_method(grid, cell), cell.tag)
        if done is None:
            print(f"{head}: {cell.tag} ({cell.supernodes} clients); {countdown.status()}", flush=True)
            start = clock()
            try:
                launched = launch([*cell.run_config, f"run-tag=\"{cell.tag}\" output-dir=\"{out_dir}\""],
                                  f"num-supernodes={cell.supernodes} client-resources-num-cpus=1", quiet=quiet,
                                  timeout=timeout)
                done = launched.run_dir if launched.code == 0 else None
                outcome = "done" if done is not None else f"failed (status {launched.status}), left out of the tables"
            except subprocess.TimeoutExpired:
                done, outcome = None, f"stopped after --timeout {timeout:.0f} s, left out of the tables"
            countdown.done(clock() - start)
            print(f"{head}: {cell.tag} {outcome} in {duration(countdown.took[-1])}; {countdown.status()} "
                  f"({countdown.left_units} of {todo} cells to run)", flush=True)
        else:
            print(f"{head}: {cell.tag} already done ({done.name})", flush=True)
        if done is not None:
            runs[cell.tag] = done
    return runs


def collect_runs(grid: Grid, cells: Sequence[Cell], out_dir: Path) -> dict[str, Path]:
    return {c.tag: run for c in cells if (run := finished_run(out_dir, cell_method(grid, c), c.tag)) is not None}


def selected_groups(args: Any, groups: Sequence[str], grid_name: str) -> list[str]:
    """The groups `--only` names (all when empty); SystemExit naming the grid's groups for an unknown one."""
    only = [g for g in str(getattr(args, "only", "")).split(",") if g] or list(groups)
    unknown = sorted(set(only) - set(groups))
    if unknown:
        raise SystemExit(f"--only: unknown group(s) {unknown}; {grid_name}'s are {', '.join(groups)}")
    return only


def seeds_of(args: Any) -> list[int]:
    """`--seeds`: the seeds each replicated cell runs with; 0 (the tables' own run) must be among them."""
    seeds = [int(s) for s in str(getattr(args, "seeds", "0") or "0").split(",")]
    if 0 not in seeds:
        raise SystemExit(f"--seeds must include 0 (the tables' own run), got {seeds}")
    return seeds


def replicate(cell: Cell, seed: int) -> Cell:
    """`cell` run again with `seed=<seed>` appended to its last run config: tag `<tag>-seed<seed>`, its settings
    marking the cell it replicates. Seed 0 is the cell itself (the tables show it; the claims pool them all)."""
    if seed == 0:
        return cell
    return Cell(cell.group, f"{cell.tag}-seed{seed}", (*cell.run_config[:-1], f"{cell.run_config[-1]} seed={seed}"),
                cell.supernodes, {**cell.settings, "replicate-of": cell.tag, "seed": seed})


def replicate_tags(tags: Iterable[str], tag: str) -> dict[int, str]:
    """{seed: tag} of the cell `tag` and its replicates (`replicate`'s tags) among `tags` (e.g. the finished runs),
    by seed; {} without the cell itself (seed 0): replicates are pooled with it, never read alone."""
    tags = set(tags)
    if tag not in tags:
        return {}
    prefix = f"{tag}-seed"
    found = {int(t.removeprefix(prefix)): t for t in tags if t.startswith(prefix) and t.removeprefix(prefix).isdigit()}
    return {0: tag, **dict(sorted(found.items()))}


ARCHIVED = ("config.json", "summary.json", "metrics.jsonl", "sparsity.json", "results.md", "masks.json", "masks.npz",
            "rescore.json")


def plan(only: Sequence[str], groups: Sequence[str], needs: Iterable[tuple[str, tuple[Any, ...]]]
         ) -> dict[tuple[Any, ...], tuple[str, ...]]:
    """{cell key: the selected groups that read it, in `groups` order}, keys in first-needed order: a cell that
    several groups read is planned (and run) once. `needs`: (group, cell key) pairs."""
    wanted: dict[tuple[Any, ...], set[str]] = {}
    for group, key in needs:
        if group in only:
            wanted.setdefault(key, set()).add(group)
    return {key: tuple(sorted(g, key=list(groups).index)) for key, g in wanted.items()}


ARCHIVE_MAX_BYTES = 1 << 20  # FedSpaLLM's masks.npz (~15 MB) stays with the run; SFT-P's (~50 kB) is archived


def archive_runs(runs: dict[str, Path], dest: Path) -> list[Path]:
    """Copy each run's `ARCHIVED` files of at most `ARCHIVE_MAX_BYTES` to dest/<run directory name>/ (what the
    tables are rendered from); returns the archived directories. A run already under dest is left as it is."""
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
    """'## Runs': each cell's run directory, linked relative to tables.md (a grid's runs sit next to it, in
    outputs/grids/<grid> and in the committed docs/runs/<grid> alike)."""
    return ["## Runs", "", *(f"- `{c.tag}`: [`{runs[c.tag].name}`]({runs[c.tag].name}/)" if c.tag in runs
                             else f"- `{c.tag}`: not run" for c in grid_cells)]


def read_config(run_dir: Path) -> dict[str, Any]:
    """The run config a finished run recorded (config.json)."""
    return json.loads((run_dir / "config.json").read_text())


def read_summary(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "summary.json").read_text())


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def train_rows(run_dir: Path) -> list[dict[str, Any]]:
    """The accepted `train` rows of a run's metrics.jsonl (one per client and round: bytes, losses, kept ratios)."""
    return [r for r in read_metrics(run_dir) if r.get("phase") == "train" and r.get("status") == "accepted"]


Verdict = bool | str | None  # True held, False not held, UNRESOLVED, None not checked (cells missing)
UNRESOLVED = "unresolved"


def mark(held: Verdict) -> str:
    if held == UNRESOLVED:
        return "**unresolved**"
    return "**held**" if held else ("**not held**" if held is not None else "**not checked** (cells missing)")


@lru_cache(maxsize=8)
def model_parameters(model_name: str) -> int | None:
    """N: parameters of the run's base model (tied weights once), counted on the meta device from its config
    (no weights loaded); None when the model cannot be resolved here."""
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


Interval = tuple[float, float, int]  # (lo, hi) of a 95% interval of a − b, and the sample size n behind it
Pair = tuple[str, float | None, float | None, Callable[[float, float], bool]] | \
    tuple[str, float | None, float | None, Callable[[float, float], bool], Interval | None]


def decide(ok: Callable[[float, float], bool], a: float, b: float, interval: Interval | None) -> Verdict:
    """One comparison. Without an interval: ok(a, b), a point comparison (`judge` counts it unresolved). With
    the 95% interval [lo, hi] of a − b: held when ok holds over the whole interval (at b + lo and at b + hi), not held
    when it holds nowhere on it, else UNRESOLVED: an interval that straddles the claim's margin (0 for a > b)
    cannot decide it."""
    if interval is None:
        return ok(a, b)
    lo, hi, _ = interval
    at_lo, at_hi = ok(b + lo, b), ok(b + hi, b)
    return True if at_lo and at_hi else (False if not at_lo and not at_hi else UNRESOLVED)


def judge(pairs: list[Pair]) -> tuple[Verdict, str]:
    """(verdict, evidence) of comparisons (label, a, b, ok(a, b)[, interval of a − b]): not held as soon as one
    measured pair is not held; else not checked while a needed cell is missing; else unresolved while one is
    unresolved or has no interval (a point comparison carries no uncertainty, so it decides nothing either way);
    else held. Evidence per pair: a vs b and the effect Δ = a − b with its 95% interval and n ("no interval"
    where none is given), ✗ when not held, ? when unresolved."""
    measured, missing = [], []
    for pair in pairs:
        label, a, b, ok = pair[:4]
        interval = pair[4] if len(pair) > 4 else None  # type: ignore[misc]
        if a is None or b is None:
            missing.append(label)
        else:
            measured.append((label, a, b, interval, decide(ok, a, b, interval) if interval else UNRESOLVED))
    verdicts = [v for *_, v in measured]
    if False in verdicts:
        held: Verdict = False
    elif missing or not pairs:
        held = None
    else:
        held = UNRESOLVED if UNRESOLVED in verdicts else True
    parts = []
    for label, a, b, interval, v in measured:
        effect = (f"Δ {a - b:+.2f} [{interval[0]:.2f}, {interval[1]:.2f}], n = {interval[2]}" if interval is not None
                  else f"Δ {a - b:+.2f}, no interval")
        parts.append(f"{label}: {a:.2f} vs {b:.2f} ({effect})" + {False: " ✗", UNRESOLVED: " ?"}.get(v, ""))
    text = "; ".join(parts)
    if missing:
        text += ("; " if text else "") + "missing: " + ", ".join(missing)
    return held, text
