"""The run directory: summary, results.md and plots from the logged rows (every phase, references too)."""

from __future__ import annotations

import json
from pathlib import Path

from fedprune_app.core.config import RunConfig
from fedprune_app.core.rundir import RunDirectory


def test_finish_writes_everything_from_the_rows(tmp_path: Path) -> None:
    cfg = RunConfig.from_flower({"output-dir": str(tmp_path), "method": "fedit", "run-tag": "t"})
    run = RunDirectory.create(cfg)
    assert run.path.name.endswith("-fedit-t") and (run.path / "config.json").is_file()
    for rnd, acc in ((0, 0.25), (2, 0.75)):
        run.log({"round": rnd, "phase": "evaluate", "client": 0, "data": "src", "acc": acc, "ppl": 9.0 - rnd,
                 "status": "ok"})
    run.log({"round": 0, "phase": "evaluate", "client": None, "status": "failed", "node": 5, "problem": "boom"})
    run.log({"round": 1, "phase": "train", "client": 0, "train-loss": 1.5, "status": "accepted", "node": 4})
    for rnd in (0, 2):
        run.log({"round": rnd, "phase": "server-evaluate", "data": "wiki", "ppl": 20.0 + rnd})
    run.log({"phase": "reference", "model": "random", "data": "wiki", "ppl": 1e6})
    for client, ppl in ((0, 30.0), (1, 50.0)):  # a client-built reference: one row per client, mean reported
        run.log({"phase": "reference", "model": "standalone", "client": client, "data": "wiki", "ppl": ppl})
    run.log({"phase": "reference", "model": "standalone", "node": 9, "status": "failed", "problem": "oom"})
    summary = run.finish("completed")
    assert summary["status"] == "completed" and summary["clients"][0]["acc/untouched"] == 0.25
    assert summary["clients"][0]["acc/tuned"] == 0.75 and len(summary["dropped-replies"]) == 2
    assert summary["references"] == {"random": {"wiki": 1e6}, "standalone": {"wiki": 40.0, "clients": 2}}
    assert json.loads((run.path / "summary.json").read_text())["server"]["2"] == {"ppl `wiki`": 22.0}
    text = (run.path / "results.md").read_text()
    assert "| 0 | `src` | 0.250 | 0.750 | 9.000 | 7.000 |" in text and "1 client, each on its own test split" in text
    assert "| random | 1000000.00 |" in text and "2 client replies failed" in text
    assert "| standalone (mean of 2 clients) | 40.00 |" in text
    assert {p.name for p in (run.path / "plots").glob("*.png")} >= {"evaluate-acc.png", "train-loss.png",
                                                                    "server-evaluate-ppl.png"}
    assert len((run.path / "metrics.jsonl").read_text().splitlines()) == 10


def test_a_server_evaluated_run_claims_no_clients(tmp_path: Path) -> None:
    """FedSpaLLM evaluates only on the server: results.md must not speak of '0 clients' or per-client scores."""
    cfg = RunConfig.from_flower({"output-dir": str(tmp_path), "method": "fedspallm", "run-tag": "t"})
    run = RunDirectory.create(cfg)
    for rnd in (0, 1):
        run.log({"round": rnd, "phase": "server-evaluate", "data": "wiki", "ppl": 20.0 + rnd})
    run.finish("completed")
    text = (run.path / "results.md").read_text()
    assert text.startswith(f"# fedspallm: {cfg.num_server_rounds} rounds, model `")
    assert "0 clients" not in text and "Per client" not in text and "No federated (client-side) evaluation" in text
    assert "| 1 | 21.00 |" in text
