"""What a finished run directory holds, read back: config.json, summary.json, metrics.jsonl,
rescore.json."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fedprune_app.core.config import with_current_names
from fedprune_app.llm.intervals import TokenScores
from fedprune_cli.rescore import RESCORE_FILE


def read_config(run_dir: Path) -> dict[str, Any]:
    """The run config a finished run recorded (config.json), renamed keys under their current
    names."""
    return with_current_names(json.loads((run_dir / "config.json").read_text()))


def read_summary(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "summary.json").read_text())


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    return [
        json.loads(line)
        for line in (run_dir / "metrics.jsonl").read_text().splitlines()
        if line.strip()
    ]


def train_rows(run_dir: Path) -> list[dict[str, Any]]:
    """The accepted `train` rows of a run's metrics.jsonl (one per client and round: bytes, losses,
    kept ratios)."""
    return [
        r
        for r in read_metrics(run_dir)
        if r.get("phase") == "train" and r.get("status") == "accepted"
    ]


# --- re-scored models (rescore.json, written by `fedprune rescore`) ---

MODEL_OF_ROUND = {None: "final", 0: "dense", 1: "post-hoc"}  # the rows Table 1 reads by round


def read_rescore(runs: dict[str, Path], tag: str) -> dict[str, Any] | None:
    run = runs.get(tag)
    path = None if run is None else run / RESCORE_FILE
    return json.loads(path.read_text()) if path is not None and path.is_file() else None


def per_example(
    runs: dict[str, Path], tag: str, round_: int | None = None
) -> dict[int, list[float]]:
    """{client: acc 0/1 per example} of cell `tag`'s model for `round_` (None = final, 0 = dense, 1
    = post hoc: the latter two only in fedflap runs); {} when not re-scored."""
    record = read_rescore(runs, tag)
    model = (record or {}).get("models", {}).get(MODEL_OF_ROUND.get(round_, ""), {})
    return {int(k): [float(v) for v in scores["acc"]] for k, scores in model.items()}


def answer_units(
    runs: dict[str, Path], tag: str, round_: int | None = None
) -> dict[int, TokenScores]:
    """{client: per-example answer NLL and tokens} of cell `tag`'s model for `round_` (as
    `per_example`); {} when not re-scored or re-scored before rescore.json carried them."""
    record = read_rescore(runs, tag)
    model = (record or {}).get("models", {}).get(MODEL_OF_ROUND.get(round_, ""), {})
    return {int(k): TokenScores.of(v["nll"], v["tokens"]) for k, v in model.items() if v.get("nll")}
