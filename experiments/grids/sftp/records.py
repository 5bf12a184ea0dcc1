"""What the SFT-P grid reads from its runs' files: the `evaluate` and `train` rows of metrics.jsonl,
the budgets of config.json, the re-scored accuracies of rescore.json
(`fedprune_cli/rescore_accuracy.py`) and the masks of masks.json / masks.npz."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

from experiments.grids import read_config, read_metrics, train_rows
from experiments.grids.sftp.cells import CLIENTS
from fedprune_app.core.config import per_client
from fedprune_cli.runfiles import MODEL_OF_ROUND as MODEL_OF_ROUND
from fedprune_cli.runfiles import answer_units as answer_units
from fedprune_cli.runfiles import per_example as per_example
from fedprune_cli.runfiles import read_rescore as read_rescore

Accuracy = Callable[
    [dict[str, Path], str, int | None], dict[int, float]
]  # (runs, tag, round) -> {client: acc ×100}


# --- in-run evaluations and budgets ---------------------------------------------------------------


def last_round(run_dir: Path) -> int:
    return int(read_config(run_dir)["num-server-rounds"])


def evaluations(run_dir: Path, round_: int | None = None) -> dict[int, dict[str, Any]]:
    """{client: its `evaluate` row} of round `round_` (default the run's last round); failed rows
    left out."""
    round_ = last_round(run_dir) if round_ is None else round_
    return {
        int(r["client"]): r
        for r in read_metrics(run_dir)
        if r.get("phase") == "evaluate"
        and r.get("status") == "ok"
        and r.get("round") == round_
        and isinstance(r.get("client"), int)
    }


def targets(run_dir: Path) -> dict[int, float]:
    """{client: target keep ratio p} from the run's `keep-ratios` (one for all or one per
    partition)."""
    values = per_client(str(read_config(run_dir)["keep-ratios"]), CLIENTS, float, "keep-ratios")
    return dict(enumerate(values))


def values(rows: dict[int, dict[str, Any]], key: str) -> dict[int, float]:
    return {c: float(r[key]) for c, r in rows.items() if isinstance(r.get(key), int | float)}


def mean_of(
    per_client_values: dict[int, float], clients: Iterable[int] = range(CLIENTS)
) -> float | None:
    """The mean over `clients`; None unless every one of them has a value (a mean over fewer is not
    the row's)."""
    clients = list(clients)
    if not clients or any(c not in per_client_values for c in clients):
        return None
    return sum(per_client_values[c] for c in clients) / len(clients)


def accuracy(runs: dict[str, Path], tag: str, round_: int | None = None) -> dict[int, float]:
    """{client: acc ×100} of cell `tag` in `round_` (default its last round); {} when the cell did
    not run."""
    run = runs.get(tag)
    return (
        {}
        if run is None
        else {c: 100 * v for c, v in values(evaluations(run, round_), "acc").items()}
    )


def answer_perplexity(
    runs: dict[str, Path], tag: str, round_: int | None = None
) -> dict[int, float]:
    """{client: answer perplexity} of cell `tag` in `round_` (default its last round): exp of the
    mean NLL of its own test questions' answers (`ppl` of the evaluate rows); {} when the cell did
    not run."""
    run = runs.get(tag)
    return {} if run is None else values(evaluations(run, round_), "ppl")


def client_names(runs: Iterable[Path]) -> dict[int, str]:
    """{client: its data source} from the evaluate rows (`bigbench:` dropped)."""
    names: dict[int, str] = {}
    for run in runs:
        for r in read_metrics(run):
            if r.get("phase") == "evaluate" and isinstance(r.get("client"), int) and r.get("data"):
                names.setdefault(int(r["client"]), str(r["data"]).removeprefix("bigbench:"))
    return names


# --- re-scored accuracies (rescore.json) ----------------------------------------------------------


def rescored_accuracy(
    runs: dict[str, Path], tag: str, round_: int | None = None
) -> dict[int, float]:
    """{client: acc ×100} re-scored (the `Accuracy` the tables take)."""
    return {k: 100 * sum(v) / len(v) for k, v in per_example(runs, tag, round_).items() if v}


def rescored_perplexity(
    runs: dict[str, Path], tag: str, round_: int | None = None
) -> dict[int, float]:
    """{client: answer perplexity} re-scored (an `Accuracy`-shaped reader, for the tables)."""
    return {k: units.perplexity for k, units in answer_units(runs, tag, round_).items()}


# --- masks and kept ratios ------------------------------------------------------------------------


def read_masks(run_dir: Path) -> dict[int, dict[str, np.ndarray]] | None:
    """{client: {mask: bool (layers, d)}} from masks.npz (keys `client-<k>/<mask>`), None when
    absent."""
    path = run_dir / "masks.npz"
    if not path.is_file():
        return None
    out: dict[int, dict[str, np.ndarray]] = defaultdict(dict)
    with np.load(path) as npz:
        for key in npz.files:
            client, name = key.split("/", 1)
            out[int(client.removeprefix("client-"))][name] = npz[key].astype(bool)
    return dict(sorted(out.items()))


def read_stats(run_dir: Path) -> dict[str, Any] | None:
    path = run_dir / "masks.json"
    return json.loads(path.read_text()) if path.is_file() else None


def kept_series(run_dir: Path) -> tuple[dict[int, list[tuple[int, float]]], dict[int, float]]:
    """({client: [(round, kept ratio)]}, {client: target}) from the accepted train rows."""
    series: dict[int, list[tuple[int, float]]] = defaultdict(list)
    target: dict[int, float] = {}
    for r in train_rows(run_dir):
        if isinstance(r.get("client"), int) and isinstance(
            r.get("kept-ratio-prunable"), int | float
        ):
            series[int(r["client"])].append((int(r["round"]), float(r["kept-ratio-prunable"])))
            if isinstance(r.get("keep-target"), int | float):
                target[int(r["client"])] = float(r["keep-target"])
    return {c: sorted(v) for c, v in sorted(series.items())}, target
