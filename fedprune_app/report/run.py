"""A run's report, written as rows come (TensorBoard) and when it ends: summary.json, results.md and
the plots (`ReportedRun.finish`)."""

from __future__ import annotations

import json
import time
import warnings
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fedprune_app.core.config import RunConfig
from fedprune_app.core.rundir import RunDirectory
from fedprune_app.core.statefile import write_text_atomically
from fedprune_app.report.board import Board
from fedprune_app.report.plots import plot_rounds
from fedprune_app.report.tables import (
    MethodReport,
    broken_models,
    client_table,
    reference_means,
    render_privacy,
    render_references,
    render_results,
)


class ReportedRun(RunDirectory):
    """A run directory whose rows also go to TensorBoard as they are logged, and which renders its
    report at the end (`finish`)."""

    def __init__(self, path: Path, cfg: RunConfig) -> None:
        super().__init__(path, cfg)
        self.board = Board(path / "tensorboard", cfg.num_server_rounds, self.started)

    def observe(self, rows: list[dict[str, Any]]) -> None:
        """Every logged row's scalars to TensorBoard."""
        self.board.write(rows)

    def finish(
        self,
        status: str,
        extra: Mapping[str, Any] | None = None,
        report: MethodReport | None = None,
    ) -> dict[str, Any]:
        """Write summary.json, results.md and the plots; return the summary.

        Args:
            status: the run's end, `completed` or `failed`.
            extra: more fields for summary.json (artefacts, the error).
            report: what the method adds (its strategy's `server_columns` and `results_sections`).

        Returns:
            The summary; its `warnings`: one line per model the run broke (`broken_models`), also at
            the top of results.md.
        """
        columns = report.server_columns() if report is not None else {}
        table = client_table(self.rows("evaluate"), self.records)
        server: dict[str, dict[str, float]] = defaultdict(dict)
        for r in self.rows("server-evaluate"):
            server[str(r["round"])][f"ppl `{r['data']}`"] = r["ppl"]
            for key, (heading, _) in columns.items():  # numbers the strategy noted beside its score
                if key in r:
                    server[str(r["round"])][heading] = r[key]
        dropped = [
            {
                "round": r.get("round"),
                "phase": r["phase"],
                "node": r.get("node"),
                "problem": r.get("problem", "")[-300:],
            }
            for r in self.records
            if r.get("status") in ("failed", "rejected")
        ]
        flags = broken_models(self.records, self.cfg.method)
        summary = {
            "status": status,
            "method": self.cfg.method,
            "started-at": self.started,
            "seconds": round(time.time() - self.started, 1),
            "clients": table,
            "server": server,
            "references": reference_means(self.rows("reference")),
            "failures": len(dropped),
            "dropped-replies": dropped,
            "warnings": flags,
            **(extra or {}),
        }
        write_text_atomically(self.path / "summary.json", json.dumps(summary, indent=2) + "\n")
        try:
            self.board.close()
        except Exception as err:  # noqa: BLE001 - as the plots: never costs a finished run its status
            warnings.warn(f"writing the TensorBoard events failed: {err!r}", stacklevel=1)
        scored = self.rows("server-evaluate")
        text = render_results(self.cfg, table, scored, summary["seconds"], flags, columns)
        text += render_references(self.cfg, server, self.rows("reference"), scored)
        text += report.results_sections(self.records) if report is not None else ""
        text += render_privacy(self.rows("privacy"))
        if dropped:
            text += (
                f"\n{len(dropped)} client replies failed or were rejected and left out "
                "(details in summary.json and metrics.jsonl).\n"
            )
        write_text_atomically(self.path / "results.md", text)
        try:
            plot_rounds(self.records, self.path / "plots")
        except Exception as err:  # a figure must never cost a finished run its status
            warnings.warn(f"plotting failed: {err!r}", stacklevel=1)
        return summary
