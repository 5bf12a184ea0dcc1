"""What the FedTPA grid reads from its runs' files: the final Rouge-L of the `evaluate` rows (and
its curve over the evaluated rounds), the re-scored
Rouge-L of rescore.json (`fedprune_cli/rescore_rouge.py`) and the per-round series of the accepted
`train` rows."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

from experiments.grids import Cell, read_config, read_metrics, train_rows
from fedprune_cli.rescore import RESCORE_FILE


def evaluated_rouge(run_dir: Path) -> dict[int, list[float]]:
    """{round: the Rouge-L of each ok `evaluate` row} of the run (one row per evaluating client),
    sorted by round."""
    per_round: dict[int, list[float]] = defaultdict(list)
    for r in read_metrics(run_dir):
        if (
            r.get("phase") == "evaluate"
            and r.get("status") == "ok"
            and isinstance(r.get("round"), int)
            and isinstance(r.get("rouge-l"), int | float)
        ):
            per_round[int(r["round"])].append(float(r["rouge-l"]))
    return dict(sorted(per_round.items()))


def final_rouge(run_dir: Path, round_: int | None = None) -> float | None:
    """Mean Rouge-L of the `evaluate` rows of the run's last round (or `round_`), None when that
    round has none. The presets let one client evaluate (every client would score the same global
    test split)."""
    if round_ is None:
        round_ = int(read_config(run_dir)["num-server-rounds"])
    vals = evaluated_rouge(run_dir).get(round_)
    return sum(vals) / len(vals) if vals else None


def rouge_curve(run_dir: Path) -> dict[int, float]:
    """{round: mean Rouge-L ×100} of every evaluated round (`eval-every`: the curve that shows where
    the score stops changing), NaN scores left out, sorted by round."""
    curve = {
        t: [v for v in vals if v == v] for t, vals in evaluated_rouge(run_dir).items()
    }  # v == v: not NaN
    return {t: 100 * sum(v) / len(v) for t, v in curve.items() if v}


def rouge_table(grid_cells: list[Cell], runs: dict[str, Path]) -> dict[str, float | None]:
    """{tag: final-round Rouge-L ×100} for every cell (None: not run, or no final evaluation)."""
    out: dict[str, float | None] = {}
    for c in grid_cells:
        value = final_rouge(runs[c.tag]) if c.tag in runs else None
        out[c.tag] = None if value is None else 100 * value
    return out


def rescored_table(grid_cells: list[Cell], runs: dict[str, Path]) -> dict[str, list[float]]:
    """{tag: per-example Rouge-L} of the cells whose run has a rescore.json
    (fedprune_cli/rescore_rouge.py)."""
    out = {}
    for c in grid_cells:
        path = runs[c.tag] / RESCORE_FILE if c.tag in runs else None
        if path is not None and path.is_file():
            out[c.tag] = [float(x) for x in json.loads(path.read_text())["scores"]]
    return out


def series(run_dir: Path, key: str) -> dict[int, list[tuple[int, float]]]:
    """{client: [(round, value), ...]} of a numeric key of the accepted train rows, sorted by
    round."""
    out: dict[int, list[tuple[int, float]]] = defaultdict(list)
    for row in train_rows(run_dir):
        value = row.get(key)
        if (
            isinstance(row.get("client"), int) and isinstance(value, int | float) and value == value
        ):  # not NaN
            out[int(row["client"])].append((int(row["round"]), float(value)))
    return {c: sorted(v) for c, v in sorted(out.items())}
