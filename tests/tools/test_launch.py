"""What the launcher prints when a run fails: the run's own error, from summary.json (no Ray: the ServerApp runs on
the in-process grid of tests/local_grid.py)."""

from __future__ import annotations

import json
from pathlib import Path

from fedprune_app.core.strategy import RoundFailed
from tests.conftest import small_config
from tests.local_grid import LocalGrid, run_server
from tools.launch import run_error


def test_a_run_in_which_every_client_fails_ends_with_their_error_on_the_screen(tiny_model_dir: Path, tmp_path: Path,
                                                                               flower_ids: None) -> None:
    """Every ClientApp raises the same ConfigError: the run stops after the round's retries with that error, and it
    is summary.json's `error-message`, the line the launcher prints last."""
    cfg = small_config(tiny_model_dir, output_dir=str(tmp_path / "runs"), client_data=str(tmp_path / "gone.jsonl"),
                       server_eval_data="", num_server_rounds=2, round_retries=1)
    run, err = run_server(cfg, LocalGrid(cfg, 2, seed=0))
    assert isinstance(err, RoundFailed)
    client_error = f"run-config key 'client-data': JSONL file {tmp_path / 'gone.jsonl'} does not exist"
    assert str(err).startswith("round 1: every client failed with the same error (4 train replies in 2 attempt(s))")
    assert client_error in str(err)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["error-message"] == f"RoundFailed: {err}"
    assert run_error(run) == f"RoundFailed: {err}"


def test_run_error_without_a_summary_or_an_error_message(tmp_path: Path) -> None:
    assert run_error(None).startswith("the run left no summary.json")
    (tmp_path / "summary.json").write_text(json.dumps({"status": "failed", "error": "Traceback ...\n  File x\n"
                                                                                     "ValueError: boom\n"}))
    assert run_error(tmp_path) == "ValueError: boom"  # a run directory of an older version: the traceback's end
