"""The run directory, `outputs/<date>-<method>-<tag>/`, and its append-only metrics log.

- `config.json`: the resolved run config; `flower-run.json`: the Flower run id (how `fedprune run`
  finds its own run's directory);
- `metrics.jsonl`: one line per (round, client, phase) and per server evaluation, appended as they
  come;
- the final artefacts (written by the strategy, e.g. `adapter/`).

What is rendered from them (summary.json, results.md, plots, TensorBoard) is the report's:
`fedprune_app.report`.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from fedprune_app.core.config import RunConfig


def resolve_output_dir(output_dir: str) -> Path:
    """An absolute `output-dir` as is; a relative one against $FEDPRUNE_OUTPUT_DIR or the working
    directory."""
    path = Path(output_dir).expanduser()
    if not path.is_absolute():
        path = Path(os.environ.get("FEDPRUNE_OUTPUT_DIR", os.getcwd())) / path
    return path


class RunDirectory:
    """The run directory and its append-only metrics log."""

    def __init__(self, path: Path, cfg: RunConfig) -> None:
        self.path = path
        self.cfg = cfg
        self.started = time.time()
        self.records: list[dict[str, Any]] = []

    @classmethod
    def create(cls, cfg: RunConfig, run_id: int | None = None) -> RunDirectory:
        """A new directory `<output-dir>/<date>-<method>[-<tag>][-<n>]` with config.json (and, given
        Flower's `run_id`, flower-run.json): made with one `mkdir` each try, so two runs started in
        the same second each get their own."""
        stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
        name = "-".join(p for p in (stamp, cfg.method, cfg.run_tag) if p)
        root = resolve_output_dir(cfg.output_dir)
        root.mkdir(parents=True, exist_ok=True)
        for suffix in range(1, 10_000):
            path = root / (name if suffix == 1 else f"{name}-{suffix}")
            try:
                path.mkdir()
                break
            except FileExistsError:
                continue
        else:
            raise FileExistsError(f"no free run directory name under {root} for {name}")
        (path / "config.json").write_text(json.dumps(cfg.to_dict(), indent=2) + "\n")
        if run_id is not None:
            (path / "flower-run.json").write_text(json.dumps({"run-id": run_id}) + "\n")
        return cls(path, cfg)

    def log(self, record: Mapping[str, Any]) -> None:
        """Append one metrics line (a flat dict; `round`, `phase` and `client` are the usual
        keys)."""
        row = {"time": round(time.time() - self.started, 3), **record}
        self.records.append(row)
        with open(self.path / "metrics.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")
        self.observe([row])

    def extend(self, rows: list[dict[str, Any]]) -> None:
        """Start from rows an earlier run logged (a resumed run begins with the interrupted run's
        rounds)."""
        self.records.extend(rows)
        with open(self.path / "metrics.jsonl", "a") as f:
            f.writelines(json.dumps(row) + "\n" for row in rows)
        self.observe(rows)

    def rows(self, phase: str) -> list[dict[str, Any]]:
        """The logged rows of one phase, in order."""
        return [r for r in self.records if r.get("phase") == phase]

    def observe(self, rows: list[dict[str, Any]]) -> None:
        """Called with every row as it is logged (`log`, `extend`); nothing here. The report's
        `ReportedRun` writes them to TensorBoard."""
