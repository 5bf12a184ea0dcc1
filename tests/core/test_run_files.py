"""A run directory's files against interruptions and tampering: summary.json and results.md are
replaced atomically, a corrupt summary.json gets one line from the launcher (no traceback), a torn
last line of metrics.jsonl is dropped on resume and a bad line before it stops the resume."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedprune_app.core.checkpoint import Checkpoint, read_rows
from fedprune_app.core.config import ConfigError
from fedprune_app.core.statefile import write_text_atomically
from fedprune_cli.launch import broken_model_lines, failure_line, read_summary, run_error


def test_a_torn_last_line_is_dropped_and_said(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"round": 0, "phase": "evaluate"}\n{"round": 1, "phase": "tr')
    rows, torn = read_rows(path)
    assert rows == [{"round": 0, "phase": "evaluate"}] and torn
    checkpoint = Checkpoint(tmp_path, 1, "k", {}, {})
    assert checkpoint.rows() == [{"round": 0, "phase": "evaluate"}]


def test_a_bad_line_before_the_last_stops_the_resume_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"round": 0}\n[1, 2]\n{"round": 1}\n')
    with pytest.raises(ConfigError, match=r"'resume-from': .*metrics.jsonl line 2 is not a JSON"):
        read_rows(path)


def test_an_atomic_write_replaces_the_whole_file_and_leaves_no_temp(tmp_path: Path) -> None:
    path = tmp_path / "summary.json"
    path.write_text("old")
    write_text_atomically(path, '{"status": "completed"}\n')
    assert json.loads(path.read_text()) == {"status": "completed"}
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]


@pytest.mark.parametrize("text", ['{"status": "comp', "[1, 2]", "", "\x00\xff"])
def test_a_corrupt_summary_gets_one_line_not_a_traceback(text: str, tmp_path: Path) -> None:
    (tmp_path / "summary.json").write_text(text, errors="replace")
    assert read_summary(tmp_path) is None
    assert (
        run_error(tmp_path)
        == f"{tmp_path}/summary.json cannot be read (not a JSON table); see the log above"
    )
    assert broken_model_lines(tmp_path) == [] and failure_line(tmp_path) == ""
